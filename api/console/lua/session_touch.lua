#!lua
-- session_touch.lua: look up one console session and mark it used, or end it if it has lapsed;
-- one round trip, so a session is never extended after it lapsed (api/console/sessions.py).
--
-- KEYS[1]  P:console:session:<sha256 of the session id>   hash  k (the key's sha256, hex),
--                                                               c (opened at), s (last used at),
--                                                               both in seconds since the epoch
--
-- ARGV[1]  now, seconds since the epoch
-- ARGV[2]  idle timeout, seconds: a session unused this long has lapsed
-- ARGV[3]  lifetime, seconds: a session opened this long ago has lapsed
-- ARGV[4]  seconds the server keeps the hash from now on (its idle timeout, rounded up)
--
-- Returns the key's sha256 (hex) of a live session, now marked used at ARGV[1]; false when
-- there is none, or when it lapsed (then it is deleted).
local found = redis.call('HMGET', KEYS[1], 'k', 'c', 's')
if not found[1] or not found[2] or not found[3] then
  if found[1] or found[2] or found[3] then redis.call('DEL', KEYS[1]) end
  return false
end
local now = tonumber(ARGV[1])
if now - tonumber(found[3]) >= tonumber(ARGV[2]) or now - tonumber(found[2]) >= tonumber(ARGV[3]) then
  redis.call('DEL', KEYS[1])
  return false
end
redis.call('HSET', KEYS[1], 's', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return found[1]
