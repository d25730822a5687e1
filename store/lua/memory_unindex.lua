-- memory_unindex.lua: unfile one memory item from every index of its tenant (the reverse of
-- memory_index.lua); the caller runs it after it deleted the item (memory_delete.lua), so an
-- item is never stored without its index entries. A sweep's unfiling is conditional: an entry
-- no longer due (the item was written again meanwhile, with a later expiry) is kept.
--
-- KEYS[1]  {P:mem:T}:ids   hash  as memory_index.lua writes it
-- KEYS[2]  {P:mem:T}:x     zset  item id -> expiry ms
-- KEYS[3]  {P:mem:T}:w     zset  item id -> written ms
--
-- ARGV[1]  item id
-- ARGV[2]  the tenant's key stem '{P:mem:T}:'
-- ARGV[3]  now ms: unfile only if the expiry is not after it, or ...   ('' : unconditional)
-- ARGV[4]  cutoff ms: ... the write time is not after it                ('' : no retention)
--
-- Returns 1 if an entry was unfiled, 0 if there was none (its expiry and write time are
-- cleared anyway), -1 if it was kept (not due).

local id, stem = ARGV[1], ARGV[2]
if ARGV[3] ~= '' then
  local x = redis.call('ZSCORE', KEYS[2], id)
  local w = redis.call('ZSCORE', KEYS[3], id)
  local due = (x and tonumber(x) <= tonumber(ARGV[3]))
    or (ARGV[4] ~= '' and w and tonumber(w) <= tonumber(ARGV[4]))
  if (x or w) and not due then
    return -1
  end
end
redis.call('ZREM', KEYS[2], id)
redis.call('ZREM', KEYS[3], id)
local raw = redis.call('HGET', KEYS[1], id)
if not raw then
  return 0
end
local old = cjson.decode(raw)
for _, t in ipairs(old.u or {}) do redis.call('SREM', stem .. 'u:' .. t, id) end
for _, t in ipairs(old.c or {}) do redis.call('SREM', stem .. 'c:' .. t, id) end
redis.call('HDEL', KEYS[1], id)
return 1
