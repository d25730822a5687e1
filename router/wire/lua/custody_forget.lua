-- Forget a custodian whose custody is empty.
-- KEYS[1]  the set of custodians ({P:fleet}:custody:members)
-- KEYS[2]  the member's custody hash
-- ARGV[1]  the member
-- Returns 1 when the member left the set.
if redis.call('HLEN', KEYS[2]) == 0 then return redis.call('SREM', KEYS[1], ARGV[1]) end
return 0
