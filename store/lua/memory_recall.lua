-- memory_recall.lua: the best live items of one owner and kind for a set of tags. The caller
-- runs it once per owner it may see: no other owner's key is ever named, so visibility is the
-- query itself. Rank: tag overlap, then written ms, then item id (all descending), as one
-- exact integer score overlap * 2^42 + written ms (overlap <= 32, so below 2^53).
--
-- KEYS[1]  {P:mem:O}:r:<kind>        zset  item id -> written ms
-- KEYS[2]  {P:mem:O}:scratch         zset  working space, deleted before returning
-- KEYS[3..] {P:mem:O}:t:<kind>:<term> sets of item ids, one per query tag
--
-- ARGV[1]  now, ms (an item whose expiry is not after it is skipped)
-- ARGV[2]  limit
-- ARGV[3]  the owner's key stem '{P:mem:O}:'
--
-- Returns the items' JSON, best first, at most limit of them.

local tags = {}
for i = 3, #KEYS do tags[#tags + 1] = KEYS[i] end
local found = {}
if #tags == 0 then return found end
redis.call('ZUNIONSTORE', KEYS[2], #tags, unpack(tags))
redis.call('ZINTERSTORE', KEYS[2], 2, KEYS[2], KEYS[1], 'WEIGHTS', '4398046511104', 1)
local now, limit, stem = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local start = 0
while #found < limit do
  local ids = redis.call('ZREVRANGE', KEYS[2], start, start + limit - 1)
  if #ids == 0 then break end
  for _, id in ipairs(ids) do
    local item = redis.call('HMGET', stem .. 'i:' .. id, 'd', 'x')
    if item[1] and (item[2] == '' or tonumber(item[2]) > now) then
      found[#found + 1] = item[1]
      if #found >= limit then break end
    end
  end
  start = start + limit
end
redis.call('DEL', KEYS[2])
return found
