-- lookup.lua: the support store's lookup of an idempotency key, fenced: remember the caller's
-- fence for the key if it is the highest yet, then read what the key's write stored. One
-- script, so no write under an older fence can land between the two (a write WATCHes KEYS[1]
-- and aborts when this raises it).
--
-- KEYS[1]  P:store:fence:<key>  string  the highest fence seen for the key (absent: 0)
-- KEYS[2]  P:store:done:<key>   hash    tool -> the stored result's JSON
--
-- ARGV[1]  the lookup's fence
-- ARGV[2]  the tool
--
-- Returns the stored result's JSON, or nil if no write under the key took effect.

local fence = tonumber(ARGV[1])
local seen = tonumber(redis.call('GET', KEYS[1]) or '0')
if fence > seen then
  redis.call('SET', KEYS[1], ARGV[1])
end
return redis.call('HGET', KEYS[2], ARGV[2])
