-- unindex.lua: remove a retired trajectory from its bucket of the tenant's state index and
-- owing set (both share the trajectory's tag, store/redis_keys.py: one slot).
--
-- KEYS[1]  {P:T:#b}:index  zset  member: trajectory id, score: its state code
-- KEYS[2]  {P:T:#b}:owing  zset  member: trajectory id of an ended run that still owes
--
-- ARGV[1]  the trajectory id
--
-- Returns 1 when an index entry was removed, else 0. Only an ended state's entry (codes 7-9)
-- goes: a trajectory created again under the same id since is READY (or live) and keeps its
-- entry. The owing entry goes in any case: a retired run owed nothing.

redis.call('ZREM', KEYS[2], ARGV[1])
local score = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if score == nil or score < 7 then
  return 0
end
return redis.call('ZREM', KEYS[1], ARGV[1])
