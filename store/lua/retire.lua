-- retire.lua: compare-and-delete one finished trajectory's own keys (one hash tag).
--
-- KEYS[1]  {P:T:I}:snap   hash  v (version), s (state code), data, c<version> -> commit id
-- KEYS[2]  {P:T:I}:chain  list  the execution chain
--
-- ARGV[1]  the version the caller found finished (and owing nothing)
--
-- Returns {outcome, n}:
--    1, version   deleted (both keys)
--    0, 0         no snapshot: nothing to delete
--   -1, current   the stored version is another (a commit won) or the state is not an ended
--                 one (codes 7-9): nothing deleted
--
-- The tenant's index entry lives under another tag, so the caller removes it afterwards
-- (unindex.lua); a retire cut off between the two leaves only that entry, which the next
-- retire of the id removes.

local stored = redis.call('HMGET', KEYS[1], 'v', 's')
local current = tonumber(stored[1])
if current == nil then
  return {0, 0}
end
if current ~= tonumber(ARGV[1]) or (tonumber(stored[2]) or 0) < 7 then
  return {-1, current}
end
redis.call('DEL', KEYS[1], KEYS[2])
return {1, current}
