-- returning.lua: settle an ended turn's lease and queue the trajectory's next call, for claim.lua to
-- claim in the same run ("direct" mode). Runs after state.lua, queue.lua and gates.lua and before
-- claim.lua (keys and layout in their headers).
--
-- The worker that just ended the trajectory's turn (worker/follow_on.py) settles that turn's gate
-- lease, queues the next call and claims it in one script run, so no router can claim it in
-- between. The last ten arguments are taken off ARGV before claim.lua reads the rest: the ended
-- turn's route ("" for none), lease id ("" for none) and tokens used (-1: not known), then the
-- call's trajectory id, lane, class index, input tokens, output allowance, charge (validated by
-- the caller) and route ("" for none). The ended turn leaves its tenant's turns in flight
-- (unless the trajectory is claimed again already). Returns {-1} at once, changing nothing but
-- the settlement and that, if the trajectory is already queued or claimed.
local fields = {}
for i = 10, 1, -1 do
  fields[i] = table.remove(ARGV)
end
local s_route, s_lease, c_tid, c_lane, c_k = fields[1], fields[2], fields[4], fields[5], fields[6]
local c_now = now_or_time(ARGV[1])
if s_route ~= '' and s_lease ~= '' and redis.call('EXISTS', B .. ':g:' .. s_route) == 1 then
  gate_settle(s_route, s_lease, tonumber(fields[3]), c_now)
end
turn_ended(c_lane, c_tid, '') -- the ended turn leaves the tenant's turns in flight (ADR 0123)
if redis.call('HEXISTS', CALLS, c_tid) == 1 then
  return { -1 }
end
enqueue(c_lane, c_k, c_tid, c_lane .. '|' .. c_k .. '|' .. fields[7] .. '|' .. fields[8] .. '|'
  .. fields[9] .. '|' .. num(c_now) .. '|' .. fields[10])
