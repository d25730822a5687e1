-- queue.lua: put calls into their queues, take them out, put them back (after state.lua).
--
-- A library for enqueue.lua and resolve.lua: drr.enqueue, drr.remove, drr.decline's rotation
-- step, and the undo of a take. Keys and layout are in state.lua.

-- drr.decline's rotation step: a lane at the head of its list goes to the tail of old.
local function step_aside(lane)
  local rot = NEWK
  if geti('l:' .. lane) ~= NEW then
    rot = OLDK
  end
  if redis.call('LINDEX', rot, 0) == lane then
    redis.call('LPOP', rot)
    redis.call('RPUSH', OLDK, lane)
    seti('l:' .. lane, OLD)
    count_visit()
  end
end

-- Undo a take and decline: the call is back at the head of its queue with the credit it had,
-- and its lane stands where drr.decline leaves it (at the tail of old). Other claims of the lane
-- may have been taken since, and emptied the lane (or the class) after this one: a lane or class
-- with a call queued is always back in its rotation.
local function put_back(lane, k, tid, data, charge, lost, lostc, emptied, cemptied)
  local cap = const('cap')
  local q = qkey(lane, k)
  if classes(lane) > 1 then
    local rotation = B .. ':a:' .. lane
    if redis.call('LLEN', q) == 0 and not redis.call('LPOS', rotation, k) then
      redis.call('LPUSH', rotation, k)
    end
    local cf = 'c:' .. lane .. ':' .. k
    seti(cf, math.min(geti(cf) + charge + lostc, cap))
  end
  redis.call('LPUSH', q, tid)
  redis.call('HSET', CALLS, tid, data)
  redis.call('HINCRBY', ST, 'q:' .. lane, 1)
  seti('c:' .. lane, math.min(geti('c:' .. lane) + charge + lost, cap))
  if geti('l:' .. lane) == UNLISTED then -- its visit ended when a take emptied it
    redis.call('RPUSH', OLDK, lane)
    seti('l:' .. lane, OLD)
  elseif emptied == 0 then
    step_aside(lane)
  end
end

-- drr.enqueue: the caller has checked that tid is not queued.
local function enqueue(lane, k, tid, data)
  local cap = const('cap')
  local q = qkey(lane, k)
  if classes(lane) > 1 and redis.call('LLEN', q) == 0 then
    seti('c:' .. lane .. ':' .. k, math.min(const('Q:' .. lane .. ':' .. k), cap))
    redis.call('RPUSH', B .. ':a:' .. lane, k)
  end
  redis.call('RPUSH', q, tid)
  redis.call('HSET', CALLS, tid, data)
  local queued = redis.call('HINCRBY', ST, 'q:' .. lane, 1)
  if queued > 1 then
    return
  end
  seti('c:' .. lane, math.min(const('Q:' .. lane), cap))
  if geti('l:' .. lane) == UNLISTED then
    seti('l:' .. lane, NEW)
    redis.call('RPUSH', NEWK, lane)
    if geti('left') <= 0 then
      seti('left', rotation_length())
    end
  end
end

-- drr.remove: false if the trajectory is not in that queue.
local function remove(lane, k, tid)
  local q = qkey(lane, k)
  if redis.call('LREM', q, 1, tid) == 0 then
    return false
  end
  redis.call('HDEL', CALLS, tid)
  local queued = redis.call('HINCRBY', ST, 'q:' .. lane, -1)
  if classes(lane) > 1 and redis.call('LLEN', q) == 0 then
    class_emptied(lane, k)
  end
  if queued == 0 then
    lane_emptied(lane)
  end
  return true
end
