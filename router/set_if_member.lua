-- set_if_member.lua: set one field of a ring member's entry, only while the member is registered.
--
-- KEYS[1]  the membership hash, <prefix>:ring:members
-- ARGV[1]  the member's weight field, "w:<name>"; its presence is what "registered" means
-- ARGV[2]  the field to set, "hb:<name>" (heartbeat) or "d:<name>" (drain flag)
-- ARGV[3]  the value to store
--
-- Returns 1 when the field was set, 0 when the member is not registered (nothing is written, so a
-- heartbeat or drain for a removed member cannot leave a stray field that a later register inherits).
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
return 1
