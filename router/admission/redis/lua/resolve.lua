-- resolve.lua: end a claim (decline, reap, drop) or withdraw a trajectory, queued or claimed.
-- Runs after state.lua, queue.lua and gates.lua (keys and layout in their headers).
--
-- KEYS[1]  B:st, the admitter's state hash
-- ARGV[1]  "decline":  the call goes back to the head of its queue with the credit it had, its lane
--                      to the tail of old (drr.decline), and its gate debit is released
--          "requeue":  as decline, but only once the claim's deadline has passed (reconciler)
--          "reap":     as drop, but only once the claim's deadline has passed (reconciler); its
--                      trajectory is not READY, so its admission may stand and its turn run:
--                      unlike every other end of a claim, it keeps its turn in flight
--          "drop":     the call leaves the admitter: its charge goes back to its lane's credit
--                      (unless the claim emptied the lane, whose credit stays reset) and its gate
--                      debit is released
--          "withdraw": ARGV[2] is a trajectory id: a queued call leaves its queue (drr.remove), a
--                      claimed one is dropped
-- ARGV[2]  claim id (trajectory id for "withdraw")
-- ARGV[3]  now in seconds, or "" for the Redis server's TIME
--
-- (A confirmation is confirm.lua.) Returns {1, now} when done; {0} if there is no such pending claim (already resolved or reaped)
-- or trajectory; {-1} for requeue/reap of a claim whose deadline has not passed. Atomic with every
-- other admitter script, so a claim is resolved exactly once.
local op = ARGV[1]
local now = now_or_time(ARGV[3])

local function drop(lane, k, charge, emptied, cemptied)
  if emptied == 0 then
    local cap = const('cap')
    seti('c:' .. lane, math.min(geti('c:' .. lane) + charge, cap))
    if classes(lane) > 1 and cemptied == 0 then
      local cf = 'c:' .. lane .. ':' .. k
      seti(cf, math.min(geti(cf) + charge, cap))
    end
  end
end

local cid = ARGV[2]
if op == 'withdraw' then
  local data = redis.call('HGET', CALLS, ARGV[2])
  if not data then
    return { 0 }
  end
  if string.sub(data, 1, 1) ~= '#' then
    local lane, k = string.match(data, '^(%d+)|(%d+)|')
    remove(lane, k, ARGV[2])
    return { 1, num(now) }
  end
  cid, op = string.sub(data, 2), 'drop'
end
local packed = redis.call('HGET', CLAIMS, cid)
if not packed then
  return { 0 }
end
if op == 'requeue' or op == 'reap' then
  local deadline = tonumber(redis.call('ZSCORE', PEND, cid))
  if deadline and deadline > now then
    return { -1 }
  end
end
local lane, k, tid, data, charge, lost, lostc, emptied, cemptied = unpack_claim(packed)
redis.call('HDEL', CLAIMS, cid)
redis.call('ZREM', PEND, cid)
if op ~= 'reap' then
  turn_ended(lane, tid, cid)
end
local route = route_of(data)
if route ~= '' then
  gate_release(route, cid)
end
if op == 'decline' or op == 'requeue' then
  put_back(lane, k, tid, data, charge, lost, lostc, emptied, cemptied)
else
  redis.call('HDEL', CALLS, tid)
  drop(lane, k, charge, emptied, cemptied)
end
return { 1, num(now) }
