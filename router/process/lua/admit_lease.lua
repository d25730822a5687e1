-- admit_lease.lua: renew or release the admitting router's lease, only if it is still ours.
--
-- KEYS[1]  P:fleet:admitter, the lease (a string holding the holder's router name)
-- ARGV[1]  the router name that believes it holds the lease
-- ARGV[2]  "renew" or "release"
-- ARGV[3]  the new time to live in milliseconds (renew only)
--
-- Returns 1 when the lease was ours (renewed or released), 0 otherwise (nothing changed).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == 'release' then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
end
return 1
