-- unindex.lua: remove a retired trajectory's entry from its tenant's state index.
--
-- KEYS[1]  the index key that lists the trajectory (zset; member: its snapshot key,
--          score: its state code)
--
-- ARGV[1]  the member (the trajectory's snapshot key)
--
-- Returns 1 when an entry was removed, else 0. Only an ended state's entry (codes 7-9) goes:
-- a trajectory created again under the same id since is READY (or live) and keeps its entry.

local score = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if score == nil or score < 7 then
  return 0
end
return redis.call('ZREM', KEYS[1], ARGV[1])
