-- memory_put.lua: write one memory item of one owner, replacing the item of the same id and
-- its tag memberships; one owner's keys share a hash tag, so this is one atomic step.
--
-- KEYS[1]  {P:mem:O}:i:<id>     hash  d (the item's JSON), w (written ms), x (expiry ms or ''),
--                                     k (kind), t (its tag terms, space separated)
-- KEYS[2]  {P:mem:O}:r:<kind>   zset  member: item id; score: written ms (recency, listing)
--
-- ARGV[1]  item id
-- ARGV[2]  kind
-- ARGV[3]  item JSON
-- ARGV[4]  written ms
-- ARGV[5]  expiry ms, or '' for none
-- ARGV[6]  the owner's key stem '{P:mem:O}:' (tag sets are <stem>t:<kind>:<term>; same slot)
-- ARGV[7..] the item's tag terms
--
-- Returns 1 if an item was replaced, 0 if it is new.

local stem, id = ARGV[6], ARGV[1]
local old = redis.call('HMGET', KEYS[1], 'k', 't')
local replaced = 0
if old[1] then
  replaced = 1
  for term in string.gmatch(old[2] or '', '%S+') do
    redis.call('SREM', stem .. 't:' .. old[1] .. ':' .. term, id)
  end
  redis.call('ZREM', stem .. 'r:' .. old[1], id)
end
local terms = {}
for i = 7, #ARGV do
  terms[#terms + 1] = ARGV[i]
  redis.call('SADD', stem .. 't:' .. ARGV[2] .. ':' .. ARGV[i], id)
end
redis.call('HSET', KEYS[1], 'd', ARGV[3], 'w', ARGV[4], 'x', ARGV[5], 'k', ARGV[2],
  't', table.concat(terms, ' '))
redis.call('ZADD', KEYS[2], ARGV[4], id)
return replaced
