-- init.lua: install a configuration into the admitter's state: write it into an empty state,
-- check a file's is the one there, or reconfigure a live state to a newer version.
-- Runs after state.lua (keys and layout in its header).
--
-- KEYS[1]  B:st, the admitter's state hash
-- ARGV[1]  configuration version (0: a file, which must match exactly; >= 1: the fleet's
--          document, applied when newer than the state's)
-- ARGV[2]  configuration fingerprint; ARGV[3] credit cap
-- ARGV[4]  the tenants as JSON: [[name, quantum, [[class, quantum], ...], cap], ...] (cap:
--          max_in_flight, 0 for none)
--
-- Lanes are stable by tenant name and classes by name within their lane (B:st 'layout', JSON
-- [[tenant, [class, ...]], ...], lane i at position i): a tenant or class seen before keeps its
-- number, queue and credit; a new one is appended with no credit (no debt, nothing owed); one
-- the new version leaves out keeps its lane, queue and last quantum, so what it has queued
-- drains. Every credit is clipped to the new cap. Each tenant's max_in_flight is written with its
-- quantum (L:i; a retired tenant keeps its last one) and the lanes with one listed in capped:
-- a lowered cap admits nothing of the tenant until enough of its turns end, and ends none.
--
-- Returns {1, layout} if it wrote, {0, layout} if the state already holds this version or a
-- newer one (nothing written), or {-1, fingerprint} if a file's configuration differs from the
-- state's (nothing written).
local version, fp, cap = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local found = redis.call('HGET', ST, 'cfg')
local layout = {}
if found then
  local held = geti('ver')
  if version == 0 or version == held then
    if found ~= fp then
      return { -1, found }
    end
    return { 0, redis.call('HGET', ST, 'layout') }
  end
  if version < held then
    return { 0, redis.call('HGET', ST, 'layout') }
  end
  layout = cjson.decode(redis.call('HGET', ST, 'layout'))
else
  redis.call('HSET', ST, 'rounds', 0, 'left', 0, 'seq', 0)
end

local lane_of = {}
for i, entry in ipairs(layout) do
  lane_of[entry[1]] = i - 1
end

for _, tenant in ipairs(cjson.decode(ARGV[4])) do
  local name, quantum, wanted, limit = tenant[1], tenant[2], tenant[3], tenant[4] or 0
  local lane = lane_of[name]
  if lane == nil then
    lane = #layout
    layout[lane + 1] = { name, {} }
    lane_of[name] = lane
    redis.call('HSET', ST, 'c:' .. lane, 0, 'q:' .. lane, 0, 'l:' .. lane, UNLISTED,
      'N:' .. lane, 0, 'C:' .. lane, 0, 'k:' .. lane, 0)
  end
  redis.call('HSET', ST, 'Q:' .. lane, quantum, 'L:' .. lane, limit)
  local names = layout[lane + 1][2]
  local before = #names
  for _, class in ipairs(wanted) do
    local k = nil
    for j, known in ipairs(names) do
      if known == class[1] then
        k = j - 1
      end
    end
    if k == nil then
      k = #names
      names[k + 1] = class[1]
      redis.call('HSET', ST, 'c:' .. lane .. ':' .. k, 0)
    end
    redis.call('HSET', ST, 'Q:' .. lane .. ':' .. k, class[2])
  end
  -- A lane that gains its second class starts a class rotation: its queued class joins it.
  if before <= 1 and #names > 1 and redis.call('LLEN', qkey(lane, 0)) > 0 then
    redis.call('RPUSH', B .. ':a:' .. lane, 0)
    redis.call('HSET', ST, 'c:' .. lane .. ':0', math.min(geti('Q:' .. lane .. ':0'), cap))
  end
  redis.call('HSET', ST, 'k:' .. lane, #names)
end

local capped = {}
for lane, entry in ipairs(layout) do
  local i = lane - 1
  if geti('L:' .. i) > 0 then
    capped[#capped + 1] = i
  end
  redis.call('HSET', ST, 'c:' .. i, math.min(geti('c:' .. i), cap))
  for k = 0, #entry[2] - 1 do
    local cf = 'c:' .. i .. ':' .. k
    redis.call('HSET', ST, cf, math.min(geti(cf), cap))
  end
end

local encoded = cjson.encode(layout)
redis.call('HSET', ST, 'cfg', fp, 'ver', version, 'cap', cap, 'n', #layout, 'layout', encoded,
  'capped', table.concat(capped, ' '))
return { 1, encoded }
