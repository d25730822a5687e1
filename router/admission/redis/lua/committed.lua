-- committed.lua: confirm one claim only if the admission it stands for committed, and record
-- that admission for the figures. Runs after state.lua and confirm.lua. A worker that admits a
-- follow-on turn itself sends it behind the admission's compare-and-set, in the same round trip
-- (worker/follow_on.py): the confirmation must not count a turn whose admission lost its race.
-- One node only: the snapshot and the figures live outside the admitter's slot.
--
-- KEYS[1]  B:st, the admitter's state hash
-- KEYS[2]  the trajectory's snapshot hash (store/lua/cas.lua: c<version> -> commit id)
-- KEYS[3]  the admissions list of the figures (router/wire/feed.py)
-- ARGV[1]  now in seconds, or "" for the Redis server's TIME
-- ARGV[2]  the admission's commit field, c<version>
-- ARGV[3]  the admission's commit id
-- ARGV[4]  the admission's entry for the figures (JSON)
-- ARGV[5]  how many entries the admissions list keeps
-- ARGV[6]  the claim id
--
-- Returns confirm.lua's reply when the snapshot holds that commit id for that version, else
-- {now, -1}: nothing written, the claim still pending (the caller declines it).
if redis.call('HGET', KEYS[2], ARGV[2]) ~= ARGV[3] then
  return { num(now_or_time(ARGV[1])), -1 }
end
redis.call('RPUSH', KEYS[3], ARGV[4])
redis.call('LTRIM', KEYS[3], -tonumber(ARGV[5]), -1)
return confirm_claims(6)
