-- confirm.lua: end claims as admitted (each trajectory's compare-and-set admission committed).
-- Runs after state.lua (keys and layout in its header); committed.lua may follow it.
--
-- KEYS[1]  B:st, the admitter's state hash
-- ARGV[1]  now in seconds, or "" for the Redis server's TIME
-- ARGV[2 ..] claim ids (ARGV[first ..] when committed.lua runs it)
--
-- Each claim ends; its call stays out of its queue, its charge stays deducted, and its gate debit
-- stands (the dispatcher settles it later with the claim id as lease id). The tenant's admitted
-- calls and charge are counted. Returns {now, then per claim 1, or 0 if it is not pending
-- (withdrawn, or reaped by the reconciler: its debit was released, so the caller must debit
-- again before it sends)}.
local function confirm_claims(first)
  local reply = { num(now_or_time(ARGV[1])) }
  local calls, charges = {}, {}
  for i = first, #ARGV do
    local cid = ARGV[i]
    local packed = redis.call('HGET', CLAIMS, cid)
    if packed then
      local lane, _, tid, _, charge = unpack_claim(packed)
      redis.call('HDEL', CLAIMS, cid)
      redis.call('ZREM', PEND, cid)
      redis.call('HDEL', CALLS, tid)
      calls[lane] = (calls[lane] or 0) + 1
      charges[lane] = (charges[lane] or 0) + charge
      reply[#reply + 1] = 1
    else
      reply[#reply + 1] = 0
    end
  end
  for lane, n in pairs(calls) do
    redis.call('HINCRBY', ST, 'N:' .. lane, n)
    redis.call('HINCRBY', ST, 'C:' .. lane, charges[lane])
  end
  return reply
end

if #KEYS == 1 then
  return confirm_claims(2)
end
