-- memory_index.lua: file one memory item in its tenant's indexes (by id, by each user it
-- concerns, by each call its provenance names, by expiry, by write time), unfiling it first
-- from what the same id was filed under before. Every key shares the tenant's hash tag, so
-- this is one atomic step; the caller runs it before it writes the item (memory_put.lua).
--
-- KEYS[1]  {P:mem:T}:ids   hash  item id -> entry JSON {"o": [scope, subject],
--                                  "u": [user tokens], "c": [call tokens]}
--                                  (an entry written before 0.3 is a bare [scope, subject])
-- KEYS[2]  {P:mem:T}:x     zset  item id -> expiry ms (only items that expire)
-- KEYS[3]  {P:mem:T}:w     zset  item id -> written ms
--
-- ARGV[1]  item id
-- ARGV[2]  the entry JSON
-- ARGV[3]  the tenant's key stem '{P:mem:T}:' (sets <stem>u:<token> and <stem>c:<token>)
-- ARGV[4]  expiry ms, or '' for none
-- ARGV[5]  written ms
--
-- Returns 1 if an entry was replaced, 0 if it is new.

local id, stem = ARGV[1], ARGV[3]
local replaced = 0
local raw = redis.call('HGET', KEYS[1], id)
if raw then
  replaced = 1
  local old = cjson.decode(raw)
  for _, t in ipairs(old.u or {}) do redis.call('SREM', stem .. 'u:' .. t, id) end
  for _, t in ipairs(old.c or {}) do redis.call('SREM', stem .. 'c:' .. t, id) end
end
local entry = cjson.decode(ARGV[2])
for _, t in ipairs(entry.u or {}) do redis.call('SADD', stem .. 'u:' .. t, id) end
for _, t in ipairs(entry.c or {}) do redis.call('SADD', stem .. 'c:' .. t, id) end
redis.call('HSET', KEYS[1], id, ARGV[2])
if ARGV[4] == '' then
  redis.call('ZREM', KEYS[2], id)
else
  redis.call('ZADD', KEYS[2], ARGV[4], id)
end
redis.call('ZADD', KEYS[3], ARGV[5], id)
return replaced
