-- Hand every turn in one custody hash to another custodian.
-- KEYS[1]  the custody hash to empty
-- KEYS[2]  the custody hash that receives its entries (entries already there are kept)
-- KEYS[3]  the set of custodians ({P:fleet}:custody:members)
-- ARGV[1]  KEYS[2]'s custodian, added to KEYS[3]
-- Returns how many entries moved.
local entries = redis.call('HGETALL', KEYS[1])
if #entries == 0 then return 0 end
for i = 1, #entries, 2 do
  redis.call('HSETNX', KEYS[2], entries[i], entries[i + 1])
end
redis.call('DEL', KEYS[1])
redis.call('SADD', KEYS[3], ARGV[1])
return #entries / 2
