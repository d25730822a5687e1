-- in_flight.lua: the tenants' turns in flight (ADR 0123): end turns, or read a page of a lane's.
-- Runs after state.lua (keys and layout in its header).
--
-- KEYS[1]  B:st, the admitter's state hash
-- ARGV[1]  "end":  then triples lane, trajectory id, claim id: each turn leaves its lane's turns
--                  in flight if its entry still names that claim ("": any claim whose call is
--                  not still claimed, as turn_ended in state.lua). Returns how many left.
--          "page": ARGV[2] lane, ARGV[3] HSCAN cursor, ARGV[4] count. Returns {next cursor,
--                  then per entry whose claim is no longer pending: trajectory id, claim id}
--                  (a pending claim's turn has not started: nothing to check yet).
if ARGV[1] == 'end' then
  local n = 0
  for i = 2, #ARGV - 2, 3 do
    n = n + turn_ended(ARGV[i], ARGV[i + 1], ARGV[i + 2])
  end
  return n
end
local page = redis.call('HSCAN', fkey(ARGV[2]), ARGV[3], 'COUNT', tonumber(ARGV[4]))
local reply = { page[1] }
local entries = page[2]
for i = 1, #entries, 2 do
  local tid, cid = entries[i], entries[i + 1]
  if redis.call('HGET', CALLS, tid) ~= '#' .. cid then
    reply[#reply + 1] = tid
    reply[#reply + 1] = cid
  end
end
return reply
