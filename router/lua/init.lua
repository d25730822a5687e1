-- init.lua: write the admitter's configuration into an empty state, or check it is the same.
-- Runs after state.lua (keys and layout in its header).
--
-- KEYS[1]  B:st, the admitter's state hash
-- ARGV[1]  configuration fingerprint; ARGV[2] credit cap; ARGV[3] number of lanes
-- ARGV[4..] per lane: quantum, number of classes, then that many class quanta
--
-- Returns 1 if it wrote the state, 0 if the same configuration is already there, and
-- {-1, fingerprint} if another configuration is (nothing is written then).
local found = redis.call('HGET', ST, 'cfg')
if found then
  if found == ARGV[1] then
    return 0
  end
  return { -1, found }
end
local n = tonumber(ARGV[3])
redis.call('HSET', ST, 'cfg', ARGV[1], 'cap', ARGV[2], 'n', n, 'rounds', 0, 'left', 0, 'seq', 0)
local at = 4
for lane = 0, n - 1 do
  local classes = tonumber(ARGV[at + 1])
  redis.call('HSET', ST, 'Q:' .. lane, ARGV[at], 'k:' .. lane, classes, 'c:' .. lane, 0,
    'q:' .. lane, 0, 'l:' .. lane, 0, 'N:' .. lane, 0, 'C:' .. lane, 0)
  for k = 0, classes - 1 do
    redis.call('HSET', ST, 'Q:' .. lane .. ':' .. k, ARGV[at + 2 + k], 'c:' .. lane .. ':' .. k, 0)
  end
  at = at + 2 + classes
end
return 1
