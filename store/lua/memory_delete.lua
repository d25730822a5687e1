-- memory_delete.lua: delete one memory item of one owner with its tag memberships. A sweep's
-- delete is conditional: an item no longer due (written again meanwhile) is kept.
--
-- KEYS[1]  {P:mem:O}:i:<id>     hash  as memory_put.lua writes it (w written ms, x expiry)
--
-- ARGV[1]  item id
-- ARGV[2]  the owner's key stem '{P:mem:O}:'
-- ARGV[3]  now ms: delete only if the expiry is not after it, or ...   ('' or absent: always)
-- ARGV[4]  cutoff ms: ... the write time is not after it               ('' : no retention)
--
-- Returns 1 if the item was deleted, 0 if it did not exist, -1 if it was kept (not due).

local stem, id = ARGV[2], ARGV[1]
local old = redis.call('HMGET', KEYS[1], 'k', 't', 'w', 'x')
if not old[1] then
  return 0
end
if ARGV[3] and ARGV[3] ~= '' then
  local expired = old[4] and old[4] ~= '' and tonumber(old[4]) <= tonumber(ARGV[3])
  local retired = ARGV[4] ~= '' and tonumber(old[3]) <= tonumber(ARGV[4])
  if not (expired or retired) then
    return -1
  end
end
for term in string.gmatch(old[2] or '', '%S+') do
  redis.call('SREM', stem .. 't:' .. old[1] .. ':' .. term, id)
end
redis.call('ZREM', stem .. 'r:' .. old[1], id)
redis.call('DEL', KEYS[1])
return 1
