-- state.lua: the admitter's state in Redis, its keys, and the helpers every admitter script uses.
--
-- A library, not a script: the admitter (router/admission/redis/state.py) and the gates put it first in
-- every script they run (then pick.lua, queue.lua or gates.lua as each needs); each gets
-- KEYS[1] = B..':st'. Every other key is derived from B = "{<prefix>:adm}", so all of them carry
-- the same hash tag and live in KEYS[1]'s slot (one slot is the price of an atomic pick; Redis
-- Cluster runs these scripts on that node). The policy is router/admission/drr.py's, the state its DrrState:
--
--   B:st       hash  cap (credit cap), n (lanes), cfg (config fingerprint), rounds, left (visits
--                    left in the round), seq (claim counter); per lane i: c:i credit, q:i queued,
--                    l:i listed (0 out, 1 new, 2 old), Q:i quantum, k:i classes, N:i and C:i
--                    admitted calls and charge; per class: c:i:k credit, Q:i:k quantum
--   B:new      list  lanes in the new list (the sparse-flow rule), lane ids "0".."n-1"
--   B:old      list  lanes in the old list
--   B:a:i      list  class rotation of lane i (only lanes with more than one class)
--   B:q:i:k    list  FIFO of trajectory ids, lane i, class k
--   B:calls    hash  trajectory id -> "lane|class|input|output|charge|ready_at|route", or
--                    "#<claim id>" while the call is claimed
--   B:claims   hash  claim id -> "lost|lostc|emptied|cemptied|<call data>|tid"
--   B:pend     zset  claim id scored by its deadline (the reconciler reaps those past it)
--   B:f:i      hash  lane i's turns in flight: trajectory id -> the claim id that admitted it,
--                    from the claim to the turn's end (ADR 0123); B:st L:i is the lane's cap
--                    (max_in_flight, 0: none) and B:st capped the lanes with one, space-separated
--
-- Credits and charges are integers (exact in Lua's doubles up to 2^53), as in drr.py.

local B = string.sub(KEYS[1], 1, -4)
local ST, NEWK, OLDK = KEYS[1], B .. ':new', B .. ':old'
local CALLS, CLAIMS, PEND = B .. ':calls', B .. ':claims', B .. ':pend'
local UNLISTED, NEW, OLD = 0, 1, 2

local function geti(field)
  return tonumber(redis.call('HGET', ST, field)) or 0
end

local function seti(field, value)
  redis.call('HSET', ST, field, value)
end

-- Configuration fields never change while a script runs: read each once per run.
local constants = {}
local function const(field)
  local value = constants[field]
  if value == nil then
    value = geti(field)
    constants[field] = value
  end
  return value
end

local function classes(lane)
  return const('k:' .. lane)
end

local function qkey(lane, k)
  return B .. ':q:' .. lane .. ':' .. k
end

local function now_or_time(arg)
  local given = tonumber(arg)
  if given then
    return given
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local function num(x)
  return string.format('%.6f', x)
end

-- "lane|class|input|output|charge|ready_at|route"
local function charge_of(data)
  local charge = string.match(data, '^%d+|%d+|%d+|%d+|(%d+)|')
  return tonumber(charge)
end

local function route_of(data)
  return string.match(data, '^%d+|%d+|%d+|%d+|%d+|[^|]*|(.*)$')
end

-- Lane i's turns in flight (ADR 0123).
local function fkey(lane)
  return B .. ':f:' .. lane
end

-- The turn of tid in lane ends: its in-flight entry goes, if it still names claim cid ("": any
-- claim but a pending one, whose call is still claimed: that turn has not started). Idempotent.
local function turn_ended(lane, tid, cid)
  local held = redis.call('HGET', fkey(lane), tid)
  if not held then
    return 0
  end
  if cid == '' then
    if redis.call('HGET', CALLS, tid) == '#' .. held then
      return 0
    end
  elseif held ~= cid then
    return 0
  end
  return redis.call('HDEL', fkey(lane), tid)
end

local function rotation_length()
  return redis.call('LLEN', NEWK) + redis.call('LLEN', OLDK)
end

local function count_visit()
  local left = geti('left') - 1
  if left <= 0 then
    redis.call('HINCRBY', ST, 'rounds', 1)
    left = rotation_length()
  end
  seti('left', left)
end

local function lane_emptied(lane)
  seti('c:' .. lane, 0)
  if geti('l:' .. lane) == NEW then
    local at_head = redis.call('LINDEX', NEWK, 0) == lane
    redis.call('LREM', NEWK, 1, lane)
    redis.call('RPUSH', OLDK, lane)
    seti('l:' .. lane, OLD)
    if at_head then
      count_visit()
    end
  elseif redis.call('LINDEX', OLDK, 0) == lane then
    redis.call('LPOP', OLDK)
    seti('l:' .. lane, UNLISTED)
    count_visit()
  end
end

local function class_emptied(lane, k)
  seti('c:' .. lane .. ':' .. k, 0)
  local act = B .. ':a:' .. lane
  if redis.call('LINDEX', act, 0) == k then
    redis.call('LPOP', act)
  else
    redis.call('LREM', act, 1, k)
  end
end

-- "lost|lostc|emptied|cemptied|<call data>|tid" (the id last: it may hold any character)
local function pack_claim(lost, lostc, emptied, cemptied, data, tid)
  return lost .. '|' .. lostc .. '|' .. emptied .. '|' .. cemptied .. '|' .. data .. '|' .. tid
end

-- lane, class, trajectory id, call data, charge, lost, lostc, emptied, cemptied
local function unpack_claim(packed)
  local lost, lostc, emptied, cemptied, data, tid = string.match(
    packed, '^(%-?%d+)|(%-?%d+)|(%d)|(%d)|(%d+|%d+|%d+|%d+|%d+|[^|]*|[^|]*)|(.*)$')
  local lane, k = string.match(data, '^(%d+)|(%d+)|')
  return lane, k, tid, data, charge_of(data), tonumber(lost), tonumber(lostc),
    tonumber(emptied), tonumber(cemptied)
end
