-- pick.lua: drr.nominate and drr.confirm over the admitter's state (after state.lua).
--
-- A library for claim.lua: choose the next call by weighted deficit round-robin with the
-- sparse-flow rule, and take it out of its queue. Keys and layout are in state.lua.

-- The class whose head call the tenant offers next, or nil if none can ever fit.
local function class_head(lane, cap)
  local act = B .. ':a:' .. lane
  local n = redis.call('LLEN', act)
  local idle = 0
  while true do
    local k = redis.call('LINDEX', act, 0)
    local tid = redis.call('LINDEX', qkey(lane, k), 0)
    local cf = 'c:' .. lane .. ':' .. k
    local credit = geti(cf)
    if charge_of(redis.call('HGET', CALLS, tid)) <= credit then
      return k
    end
    local grant = credit + const('Q:' .. lane .. ':' .. k)
    if grant > cap then
      grant = cap
    end
    seti(cf, grant)
    if grant ~= credit then idle = 0 else idle = idle + 1 end
    redis.call('LMOVE', act, act, 'LEFT', 'RIGHT')
    if idle > n then
      return nil
    end
  end
end

-- The route of the call a lane offers next (its first active class's head).
local function head_route(lane)
  local k = '0'
  if classes(lane) > 1 then
    k = redis.call('LINDEX', B .. ':a:' .. lane, 0)
  end
  return route_of(redis.call('HGET', CALLS, redis.call('LINDEX', qkey(lane, k), 0)))
end

-- The first lane of new, then of old, not in skip; and its list. Nil if there is none.
-- Read a page at a time: the cost follows the lanes skipped (at most one per gate refusal in
-- this run), not the length of the rotation (10,000 tenants make LRANGE 0 -1 the whole pick).
local PAGE = 32
local function first_unskipped(skip)
  for _, list in ipairs({ NEWK, OLDK }) do
    local from = 0
    while true do
      local page = redis.call('LRANGE', list, from, from + PAGE - 1)
      for _, lane in ipairs(page) do
        if not skip[lane] then
          return lane, list
        end
      end
      if #page < PAGE then
        break
      end
      from = from + PAGE
    end
  end
  return nil, nil
end

local function leave(list, lane)
  if redis.call('LINDEX', list, 0) == lane then
    redis.call('LPOP', list)
  else
    redis.call('LREM', list, 1, lane)
  end
end

-- drr.nominate(state, skip, closed): lane, class, trajectory id, call data, charge; or nil.
-- skip: lanes passed over where they stand; closed: routes whose gate refused, whose lanes join
-- skip when the scan reaches them (before their visit can end or earn credit).
local function nominate(cap, skip, closed)
  local idle = 0
  while true do
    local rot, lane
    if next(skip) then
      lane, rot = first_unskipped(skip)
    else
      rot, lane = NEWK, redis.call('LINDEX', NEWK, 0)
      if not lane then
        rot, lane = OLDK, redis.call('LINDEX', OLDK, 0)
      end
    end
    if not lane then
      return nil
    end
    local visited = true
    if geti('q:' .. lane) > 0 then
      if next(closed) and closed[head_route(lane)] then
        skip[lane] = true
        visited = false
      else
        local k = '0'
        if classes(lane) > 1 then
          k = class_head(lane, cap)
        end
        local credit = geti('c:' .. lane)
        if k then
          local tid = redis.call('LINDEX', qkey(lane, k), 0)
          local data = redis.call('HGET', CALLS, tid)
          local charge = charge_of(data)
          if charge <= credit then
            return lane, k, tid, data, charge
          end
        end
        local grant = credit + const('Q:' .. lane)
        if grant > cap then
          grant = cap
        end
        seti('c:' .. lane, grant)
        if grant ~= credit then idle = 0 else idle = idle + 1 end
        leave(rot, lane)
        redis.call('RPUSH', OLDK, lane)
        seti('l:' .. lane, OLD)
      end
    else
      leave(rot, lane)
      seti('l:' .. lane, UNLISTED)
    end
    if visited then
      count_visit()
      if idle > rotation_length() then
        return nil
      end
    end
  end
end

-- drr.confirm without its checks (the caller just nominated): dequeue and deduct. Returns what
-- an undo needs: credit lost to the reset of an emptied lane / class, and whether each emptied.
local function take(lane, k, charge)
  local q = qkey(lane, k)
  redis.call('LPOP', q)
  local credit = redis.call('HINCRBY', ST, 'c:' .. lane, -charge)
  local queued = redis.call('HINCRBY', ST, 'q:' .. lane, -1)
  local lostc, cemptied = 0, 0
  if classes(lane) > 1 then
    local cc = redis.call('HINCRBY', ST, 'c:' .. lane .. ':' .. k, -charge)
    if redis.call('LLEN', q) == 0 then
      lostc, cemptied = cc, 1
      class_emptied(lane, k)
    end
  end
  local lost, emptied = 0, 0
  if queued == 0 then
    lost, emptied = credit, 1
    lane_emptied(lane)
  end
  return lost, lostc, emptied, cemptied
end
