-- gate.lua: one operation on the provider gate of one route, outside a claim.
-- Runs after state.lua and gates.lua (keys and layout in their headers).
--
-- KEYS[1]  B:st, the admitter's state hash (only its name is used: it names B)
-- ARGV[1]  operation; ARGV[2] route; ARGV[3] now in seconds, or "" for the server's TIME
--   "configure" ARGV[4..8] rpm, tpm, concurrency (-1: none), window s, lease ttl s
--   "debit"     ARGV[4] lease id, ARGV[5] tokens: gate_try (a dispatcher re-acquiring a lapsed
--               claim's quota, or a caller without an admitter)
--   "renew"     ARGV[4] lease id: extend a live lease (and its in-flight debit) by the lease ttl
--   "settle"    ARGV[4] lease id, ARGV[5] tokens used or -1 (no usage evidence: the debit stays
--               as it was): release the concurrency lease; the debit counts until now + window
--   "release"   ARGV[4] lease id: undo the debit entirely (the request never left)
--   "observe"   ARGV[4] retry-after s, ARGV[5] remaining requests, ARGV[6] remaining tokens,
--               ARGV[7] seconds until they reset (each -1 if not reported)
--   "read"      nothing
--
-- Every operation returns {ok, reason, requests, tokens, leases, rpm, tpm, concurrency, paused
-- until, remaining requests, remaining tokens, valid until} as of now, after the operation
-- (reason "unknown_route" and zeros for a route never configured).
local op, route = ARGV[1], ARGV[2]
local now = now_or_time(ARGV[3])
local g, log, amt, ls = gate_keys(route)
local ok, reason = 1, 'ok'
if op == 'configure' then
  redis.call('HSET', g, 'rpm', ARGV[4], 'tpm', ARGV[5], 'conc', ARGV[6], 'win', ARGV[7],
    'ttl', ARGV[8])
elseif redis.call('EXISTS', g) == 0 then
  return { 0, 'unknown_route', 0, 0, 0, -1, -1, -1, 0, -1, -1, 0 }
elseif op == 'debit' then
  ok, reason = gate_try(route, ARGV[4], tonumber(ARGV[5]), now)
elseif op == 'renew' then
  local f = redis.call('HMGET', g, 'win', 'ttl')
  local expiry = tonumber(redis.call('ZSCORE', ls, ARGV[4]))
  if expiry and expiry > now then
    redis.call('ZADD', ls, num(now + tonumber(f[2])), ARGV[4])
    redis.call('ZADD', log, 'XX', num(now + tonumber(f[2]) + tonumber(f[1])), ARGV[4])
  else
    ok, reason = 0, 'lease_lost'
  end
elseif op == 'settle' then
  if not gate_settle(route, ARGV[4], tonumber(ARGV[5]), now) then
    ok, reason = 0, 'not_debited'
  end
elseif op == 'release' then
  if gate_release(route, ARGV[4]) == 0 then
    ok, reason = 0, 'not_debited'
  end
elseif op == 'observe' then
  local retry, hr, ht, reset = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]),
    tonumber(ARGV[7])
  if retry >= 0 then
    local until_ = now + retry
    if until_ > (tonumber(redis.call('HGET', g, 'pause')) or 0) then
      redis.call('HSET', g, 'pause', num(until_))
    end
  end
  if hr >= 0 or ht >= 0 then
    if reset < 0 then
      reset = tonumber(redis.call('HGET', g, 'win'))
    end
    redis.call('HSET', g, 'hu', num(now + reset))
    if hr >= 0 then redis.call('HSET', g, 'hr', hr) else redis.call('HDEL', g, 'hr') end
    if ht >= 0 then redis.call('HSET', g, 'ht', ht) else redis.call('HDEL', g, 'ht') end
  end
end
gate_trim(g, log, amt, ls, now)
local req, tok, conc = gate_counters(g, log, ls)
local f = redis.call('HMGET', g, 'rpm', 'tpm', 'conc', 'pause', 'hr', 'ht', 'hu')
return { ok, reason, req, tok, conc, tonumber(f[1]), tonumber(f[2]), tonumber(f[3]),
  f[4] or '0', tonumber(f[5]) or -1, tonumber(f[6]) or -1, f[7] or '0' }
