-- claim.lua: nominate by weighted deficit round-robin, pass the call's provider gate, and claim it.
-- Runs after state.lua, pick.lua and gates.lua (keys and layout in their headers).
--
-- KEYS[1]  B:st, the admitter's state hash (B = "{<prefix>:adm}"; every key used is under B)
-- ARGV[1]  now in seconds, or "" to use the Redis server's TIME
-- ARGV[2]  gate refusals allowed before giving up (0: one per lane in rotation)
-- ARGV[3]  seconds a claim may stay unconfirmed before the reconciler may reap it
-- ARGV[4]  "1" to return every lane's queue depth after each claim
-- ARGV[5]  "claim"; "peek": only nominate and return the call, claiming nothing; or "direct":
--          first take the expected call itself, if its route has no gate, without nominating
--          (below)
-- ARGV[6]  the trajectory id the caller expects to claim (after a peek), or ""
-- ARGV[7]  how many calls to claim at most (a dispatcher with that many free slots)
-- ARGV[8]  S, the number of lanes to skip; ARGV[9 .. 8+S] those lanes; ARGV[9+S ..] closed routes
--
-- Each try nominates as drr.nominate(state, skip, closed) does. If the call has a route, its gate
-- is debited under the new claim id as lease id. A gate that refuses leaves that lane where it
-- stands with its credit and its call (the call stays READY), and closes the route for the rest
-- of this run, so no lane behind it on that route ends a visit or overtakes it; lanes on other
-- routes are tried next. A call that passes is taken (dequeued, charge deducted, as drr.confirm)
-- and claimed: no other claim returns it until it is confirmed, declined or reaped. Claiming
-- several calls in one run is claiming them one after another.
--
-- "direct" is for the worker that just queued the call back (worker/chain.py). A call with no
-- gate takes nothing another call could want, so the order of admissions does not matter: it
-- is moved to the head of its class queue and taken as if nominated now (dequeued, its charge
-- deducted from its tenant's credit, claimed and counted like any other). A call with a gate
-- is nominated as usual.
--
-- Each call taken enters its tenant's turns in flight (B:f:lane, ADR 0123); a lane with a cap
-- (max_in_flight) that has as many turns in flight is passed over where it stands, as a lane in
-- skip is, from the start of the run or from the claim that fills it.
--
-- Returns {n, refused, last refusal reason, now, last refused route, then per claim: claim id,
-- trajectory id, call data, seq, requests, tokens, leases, rpm, tpm, concurrency (gate figures
-- right after its debit; zeros and -1 without a route), depths...}; {-2, lane, trajectory id,
-- call data} for a peek; {-3} if the nominated call is not the one expected.
local now = now_or_time(ARGV[1])
local tries = tonumber(ARGV[2])
if tries <= 0 then
  tries = rotation_length()
end
local count = tonumber(ARGV[7])
local skip, closed = {}, {}
local nskip = tonumber(ARGV[8])
for i = 9, 8 + nskip do
  skip[ARGV[i]] = true
end
for i = 9 + nskip, #ARGV do
  closed[ARGV[i]] = true
end
-- A lane with as many turns in flight as its cap is passed over where it stands, as a skipped
-- lane is (place, credit and visit kept, so its credit cannot grow while it is capped); it
-- comes back once a turn of it ends (ADR 0123).
local limits = {}
for lane in string.gmatch(redis.call('HGET', ST, 'capped') or '', '%d+') do
  limits[lane] = geti('L:' .. lane)
  if redis.call('HLEN', fkey(lane)) >= limits[lane] then
    skip[lane] = true
  end
end
local deadline = num(now + tonumber(ARGV[3]))
local cap = const('cap')
local reply = { 0, 0, '', num(now), '' }
local function direct(expected)
  local data = redis.call('HGET', CALLS, expected)
  if not data or string.sub(data, 1, 1) == '#' or route_of(data) ~= '' then
    return nil
  end
  local lane, k = string.match(data, '^(%d+)|(%d+)|')
  if skip[lane] then -- at its cap: nominated as usual, which passes it over
    return nil
  end
  local q = qkey(lane, k)
  if redis.call('LINDEX', q, 0) ~= expected then -- to the head of its class queue, for take()
    redis.call('LREM', q, 1, expected)
    redis.call('LPUSH', q, expected)
  end
  return lane, k, expected, data, charge_of(data)
end

local first = ARGV[5] == 'direct'
while reply[1] < count and reply[2] < tries do
  local lane, k, tid, data, charge
  if first then
    lane, k, tid, data, charge = direct(ARGV[6])
    first = false
  end
  if not lane then
    lane, k, tid, data, charge = nominate(cap, skip, closed)
  end
  if not lane then
    break
  end
  if ARGV[5] == 'peek' then
    return { -2, lane, tid, data }
  end
  if ARGV[6] ~= '' and ARGV[6] ~= tid then
    return { -3 }
  end
  local seq = redis.call('HINCRBY', ST, 'seq', 1) -- a refused try leaves a gap: ids stay unique
  local cid = 'c' .. seq
  local route = route_of(data)
  local ok, why, req, tok, conc, rpm, tpm, cl = 1, 'ok', 0, 0, 0, -1, -1, -1
  if route ~= '' then
    ok, why, req, tok, conc, rpm, tpm, cl = gate_try(route, cid, charge, now, true)
  end
  if ok == 1 then
    local lost, lostc, emptied, cemptied = take(lane, k, charge)
    redis.call('HSET', CLAIMS, cid, pack_claim(lost, lostc, emptied, cemptied, data, tid))
    redis.call('ZADD', PEND, deadline, cid)
    redis.call('HSET', CALLS, tid, '#' .. cid)
    redis.call('HSET', fkey(lane), tid, cid) -- its turn is in flight from now on
    if limits[lane] and redis.call('HLEN', fkey(lane)) >= limits[lane] then
      skip[lane] = true
    end
    reply[1] = reply[1] + 1
    for _, v in ipairs({ cid, tid, data, seq, req, tok, conc, rpm, tpm, cl }) do
      reply[#reply + 1] = v
    end
    if ARGV[4] == '1' then
      for i = 0, geti('n') - 1 do
        reply[#reply + 1] = geti('q:' .. i)
      end
    end
  else
    reply[2], reply[3], reply[5] = reply[2] + 1, why, route
    skip[lane] = true
    closed[route] = true
  end
end
return reply
