-- set_if_member.lua: set fields of a ring member's entry, only while the member is registered.
--
-- KEYS[1]  the membership hash, <prefix>:ring:members
-- ARGV[1]  the member's weight field, "w:<name>"; its presence is what "registered" means
-- ARGV[2k], ARGV[2k+1]  (k >= 1) a field to set and its value: "hb:<name>" (heartbeat),
--          "p:<name>" (progress) or "d:<name>" (drain flag)
--
-- Returns 1 when the fields were set, 0 when the member is not registered (nothing is written, so
-- a heartbeat or drain for a removed member cannot leave a stray field that a later register
-- inherits).
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return 0
end
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
return 1
