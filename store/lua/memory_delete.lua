-- memory_delete.lua: delete one memory item of one owner with its tag memberships.
--
-- KEYS[1]  {P:mem:O}:i:<id>     hash  as memory_put.lua writes it
--
-- ARGV[1]  item id
-- ARGV[2]  the owner's key stem '{P:mem:O}:'
--
-- Returns 1 if the item existed, 0 if not.

local stem, id = ARGV[2], ARGV[1]
local old = redis.call('HMGET', KEYS[1], 'k', 't')
if not old[1] then
  return 0
end
for term in string.gmatch(old[2] or '', '%S+') do
  redis.call('SREM', stem .. 't:' .. old[1] .. ':' .. term, id)
end
redis.call('ZREM', stem .. 'r:' .. old[1], id)
redis.call('DEL', KEYS[1])
return 1
