-- gates.lua: provider quota gates (requests and tokens per window, concurrency leases).
--
-- A library, not a script: the gate, claim and resolve scripts put it after state.lua (which
-- defines B, num and now_or_time). Keys of route R, derived from B (same hash tag):
--
--   B:g:R      hash  limits rpm, tpm, conc (-1: none), win (window s), ttl (lease s); tok (tokens
--                    counted now); pause (no debit before this time); hr, ht, hu (requests and
--                    tokens the provider last said remain, valid until hu)
--   B:g:R:log  zset  lease id -> time its debit stops counting against rpm/tpm
--   B:g:R:amt  hash  lease id -> tokens it counts (input + max output; actual after settlement)
--   B:g:R:ls   zset  lease id -> time its concurrency lease expires unless renewed
--
-- Conservative window: a debit counts from the moment it is made until `win` seconds after its
-- settlement (until lease expiry + win while in flight). A provider that counts a request for
-- `win` seconds from its arrival (which comes after the debit and before the settlement) therefore
-- never counts a request the gate no longer counts, so it never sees more than the gate allows.

local function gate_keys(route)
  local g = B .. ':g:' .. route
  return g, g .. ':log', g .. ':amt', g .. ':ls'
end

-- Drop debits whose window has passed and concurrency leases that expired (a dead holder's).
local function gate_trim(g, log, amt, ls, now)
  while true do
    local old = redis.call('ZRANGEBYSCORE', log, '-inf', num(now), 'LIMIT', 0, 500)
    if #old == 0 then
      break
    end
    local amounts = redis.call('HMGET', amt, unpack(old))
    local sum = 0
    for i = 1, #old do
      sum = sum + (tonumber(amounts[i]) or 0)
    end
    redis.call('HINCRBY', g, 'tok', -sum)
    redis.call('HDEL', amt, unpack(old))
    redis.call('ZREM', log, unpack(old))
  end
  redis.call('ZREMRANGEBYSCORE', ls, '-inf', num(now))
end

-- Counters as of now: requests counted, tokens counted, leases held.
local function gate_counters(g, log, ls)
  return redis.call('ZCARD', log), tonumber(redis.call('HGET', g, 'tok')) or 0,
    redis.call('ZCARD', ls)
end

-- What a run has read of a gate, kept for the rest of the run (nothing else writes it meanwhile):
-- a claim of many calls reads limits and counters once, not once per call.
local gate_seen = {}

local function gate_release(route, lease)
  local g, log, amt, ls = gate_keys(route)
  gate_seen[route] = nil
  redis.call('ZREM', ls, lease)
  local tokens = tonumber(redis.call('HGET', amt, lease))
  if tokens then
    redis.call('HINCRBY', g, 'tok', -tokens)
    redis.call('HDEL', amt, lease)
  end
  return redis.call('ZREM', log, lease)
end

-- A request's reply is in: release its concurrency lease; with usage evidence (`used` >= 0) its
-- debit counts what it used; either way the debit counts until now + window. Returns false if
-- the lease was never debited.
local function gate_settle(route, lease, used, now)
  local g, log, amt, ls = gate_keys(route)
  gate_seen[route] = nil
  redis.call('ZREM', ls, lease)
  local counted = tonumber(redis.call('HGET', amt, lease))
  if not counted then
    return false
  end
  if used >= 0 then
    redis.call('HINCRBY', g, 'tok', used - counted)
    redis.call('HSET', amt, lease, used)
  end
  redis.call('ZADD', log, 'XX', num(now + tonumber(redis.call('HGET', g, 'win'))), lease)
  return true
end

-- Debit one request of `tokens` under `lease`, or refuse changing nothing. `fresh`: the caller
-- made the lease id just now (a claim id), so it cannot hold a debit already.
-- Returns ok (1/0), reason, the requests, tokens and leases counted after the debit (before, if
-- refused), and the limits rpm, tpm, concurrency. A lease id that already holds a live debit is
-- not debited twice (ok, 'repeat').
local function gate_try(route, lease, tokens, now, fresh)
  local g, log, amt, ls = gate_keys(route)
  local c = gate_seen[route]
  if not c then
    local f = redis.call('HMGET', g, 'rpm', 'tpm', 'conc', 'win', 'ttl', 'pause', 'hr', 'ht', 'hu')
    if not f[4] then
      return 0, 'unknown_route', 0, 0, 0, -1, -1, -1
    end
    gate_trim(g, log, amt, ls, now)
    c = { rpm = tonumber(f[1]), tpm = tonumber(f[2]), cl = tonumber(f[3]), win = tonumber(f[4]),
      ttl = tonumber(f[5]), pause = tonumber(f[6]) or 0, hr = tonumber(f[7]),
      ht = tonumber(f[8]), hu = tonumber(f[9]) or 0 }
  end
  if not fresh and redis.call('ZSCORE', log, lease) then
    if redis.call('ZSCORE', ls, lease) then
      local req, tok, conc = gate_counters(g, log, ls)
      return 1, 'repeat', req, tok, conc, c.rpm, c.tpm, c.cl
    end
    gate_release(route, lease) -- a lapsed debit under this id is replaced, not added to
    c.req = nil
  end
  if c.req == nil then
    c.req, c.tok, c.conc = gate_counters(g, log, ls)
  end
  gate_seen[route] = c
  local req, tok, conc = c.req, c.tok, c.conc
  local why = nil
  if now < c.pause then
    why = 'paused'
  elseif c.rpm >= 0 and req + 1 > c.rpm then
    why = 'rpm'
  elseif c.tpm >= 0 and tok + tokens > c.tpm then
    why = 'tpm'
  elseif c.cl >= 0 and conc + 1 > c.cl then
    why = 'concurrency'
  elseif now < c.hu then
    if c.hr and c.hr < 1 then
      why = 'remaining_requests'
    elseif c.ht and c.ht < tokens then
      why = 'remaining_tokens'
    else
      if c.hr then
        c.hr = c.hr - 1
        redis.call('HSET', g, 'hr', c.hr)
      end
      if c.ht then
        c.ht = c.ht - tokens
        redis.call('HSET', g, 'ht', c.ht)
      end
    end
  end
  if why then
    return 0, why, req, tok, conc, c.rpm, c.tpm, c.cl
  end
  redis.call('ZADD', log, num(now + c.ttl + c.win), lease)
  redis.call('HSET', amt, lease, tokens)
  redis.call('HINCRBY', g, 'tok', tokens)
  redis.call('ZADD', ls, num(now + c.ttl), lease)
  c.req, c.tok, c.conc = req + 1, tok + tokens, conc + 1
  return 1, 'ok', c.req, c.tok, c.conc, c.rpm, c.tpm, c.cl
end
