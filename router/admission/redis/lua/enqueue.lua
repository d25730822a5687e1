-- enqueue.lua: queue READY calls at the tail of their class queues (drr.enqueue).
-- Runs after state.lua and queue.lua (keys and layout in their headers).
--
-- KEYS[1]  B:st, the admitter's state hash
-- ARGV[1]  now in seconds, or "" to use the Redis server's TIME (the calls' ready_at)
-- ARGV[2 ..] eight per call: trajectory id, lane (tenant index), class index, input tokens,
--          output allowance, charge (validated by the caller), route ("" for none), and the
--          tenant's max_ready, or -1 for no limit (a running trajectory coming back)
--
-- Returns {ready_at, then per call 1 if queued, -1 if the trajectory is already queued or
-- claimed, or -(2 + depth) if the tenant's queue is full}. A refused call changes nothing.
local ready_at = num(now_or_time(ARGV[1]))
local reply = { ready_at }
for at = 2, #ARGV, 8 do
  local tid, lane, k = ARGV[at], ARGV[at + 1], ARGV[at + 2]
  local max_ready = tonumber(ARGV[at + 7])
  local depth = -1
  if max_ready >= 0 then
    depth = geti('q:' .. lane)
  end
  if redis.call('HEXISTS', CALLS, tid) == 1 then
    reply[#reply + 1] = -1
  elseif depth >= max_ready and max_ready >= 0 then
    reply[#reply + 1] = -2 - depth
  else
    enqueue(lane, k, tid, lane .. '|' .. k .. '|' .. ARGV[at + 3] .. '|' .. ARGV[at + 4] .. '|'
      .. ARGV[at + 5] .. '|' .. ready_at .. '|' .. ARGV[at + 6])
    reply[#reply + 1] = 1
  end
end
return reply
