-- prune_members.lua: delete ring members whose last heartbeat is older than the retention.
--
-- KEYS[1]  the membership hash, <prefix>:ring:members
-- ARGV[1]  the cutoff time in seconds: a member whose "hb:<name>" is below it (or absent) goes
-- ARGV[2 ..] the names of candidate members (read a moment ago; each is checked again here)
--
-- Returns the names removed. A candidate whose heartbeat landed after it was read, or that is no
-- longer registered, is left as it is; a removed member loses its whole entry (the fields of
-- Membership.remove), so nothing stale is inherited if the name registers again.
local cutoff = tonumber(ARGV[1])
local removed = {}
for i = 2, #ARGV do
  local name = ARGV[i]
  if redis.call('HEXISTS', KEYS[1], 'w:' .. name) == 1 then
    local beat = tonumber(redis.call('HGET', KEYS[1], 'hb:' .. name))
    if beat == nil or beat < cutoff then
      redis.call('HDEL', KEYS[1], 'w:' .. name, 'hb:' .. name, 'd:' .. name, 'i:' .. name,
        'p:' .. name)
      removed[#removed + 1] = name
    end
  end
end
return removed
