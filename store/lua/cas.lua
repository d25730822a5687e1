#!lua
-- cas.lua: compare-and-set one trajectory's snapshot, append its execution-chain rows, record
-- the commit id and move the trajectory in its tenant's state index; all in one round trip.
-- Every key has the tag {P:T:#b} of the trajectory's bucket (store/redis_keys.py): one slot.
--
-- KEYS[1]  {P:T:#b}:snap:I   hash  v (version), s (state code), data (the record's JSON),
--                                  and c<version> -> commit id for the last ARGV[8] versions
-- KEYS[2]  {P:T:#b}:chain:I  list  chain rows (JSON); element n is chain index n
-- KEYS[3]  {P:T:#b}:index    zset  member: a trajectory id of the bucket;
--                                  score: its state code, so a state is one score range
-- KEYS[4]  {P:T:#b}:owing    zset  member: the trajectory id of an ended run that still owes
--                                  a settlement (score 0: read in id order)
--
-- ARGV[1]  expected version (0 = create: the snapshot must not exist)
-- ARGV[2]  new version
-- ARGV[3]  new state code
-- ARGV[4]  record JSON
-- ARGV[5]  commit id
-- ARGV[6]  trajectory id
-- ARGV[7]  1 if the record ended owing, else 0
-- ARGV[8]  how many versions keep their commit id (store.redis_keys.COMMITS_KEPT): enough to
--          recognise a repeat; older ones are deleted here, so the hash does not grow
-- ARGV[9]  chain index of the first row      } only when there are rows
-- ARGV[10..] chain rows, in chain order       }
--
-- Returns {outcome, n} (store.base.Outcome):
--    2, version   this commit id is already stored for this version: a repeat, nothing written
--    1, version   applied
--    0, current   the stored version is not the expected one (0: no snapshot)
--   -1, length    the version matched but the rows do not start at the chain's length
--
-- Every check and read comes before the first write, so an error (a key of the wrong type)
-- leaves everything as it was; the shebang makes Redis refuse the script up front when it is
-- out of memory rather than at a write half way through.

local commit_field = 'c' .. ARGV[2]
local stored = redis.call('HMGET', KEYS[1], 'v', 's', commit_field)
if stored[3] == ARGV[5] then
  return {2, tonumber(ARGV[2])}
end
local current = tonumber(stored[1]) or 0
if current ~= tonumber(ARGV[1]) then
  return {0, current}
end

local with_rows = #ARGV > 9
if with_rows then
  local length = redis.call('LLEN', KEYS[2])
  if length ~= tonumber(ARGV[9]) then
    return {-1, length}
  end
end

if stored[2] ~= ARGV[3] then
  redis.call('ZADD', KEYS[3], ARGV[3], ARGV[6])
end
if ARGV[7] == '1' then
  redis.call('ZADD', KEYS[4], 0, ARGV[6])
elseif tonumber(ARGV[3]) >= 7 then  -- an ended run (codes 7-9) may have owed until now
  redis.call('ZREM', KEYS[4], ARGV[6])
end
if with_rows then
  redis.call('RPUSH', KEYS[2], unpack(ARGV, 10))
end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 's', ARGV[3], 'data', ARGV[4], commit_field, ARGV[5])
-- Versions up to the expected one may hold a commit id; those at or below new - kept go. The
-- commit before this one deleted all at or below expected - kept, so at most kept are left.
local kept = tonumber(ARGV[8])
local high = math.min(tonumber(ARGV[2]) - kept, current)
local low = math.max(1, current - kept + 1)
if high >= low then
  local stale = {}
  for version = low, high do
    stale[#stale + 1] = 'c' .. version
  end
  redis.call('HDEL', KEYS[1], unpack(stale))
end
return {1, tonumber(ARGV[2])}
