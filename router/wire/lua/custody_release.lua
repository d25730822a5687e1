-- Release one turn from a member's custody.
-- KEYS[1]  the member's custody hash ({P:fleet}:custody:m:<member>)
-- ARGV[1]  the field: "<tenant>/<trajectory>"
-- ARGV[2]  mode "version": the version the turn was sent at (a worker's release);
--          mode "exact": the entry's whole value (a reconciler's take)
-- ARGV[3]  the mode
-- Returns 1 when it deleted the field, 0 when the entry is absent or names another turn.
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
if ARGV[3] == 'exact' then
  if v ~= ARGV[2] then return 0 end
elseif string.sub(v, 1, string.len(ARGV[2]) + 1) ~= ARGV[2] .. ':' then
  return 0
end
return redis.call('HDEL', KEYS[1], ARGV[1])
