-- index_page.lua: the next ids of one state in one bucket of a tenant's state index, strictly
-- after a given id, in member order: bounded work wherever the page starts.
--
-- KEYS[1]  {P:T:#b}:index  zset  member: trajectory id, score: its state code
--
-- ARGV[1]  the state code
-- ARGV[2]  the id to continue after ("" for the first of the state); it need not be listed
-- ARGV[3]  the most ids to return
--
-- Returns up to ARGV[3] ids (fewer: the state's range in this bucket is done). The range's
-- ranks come from two ZCOUNTs; the start is the rank after ARGV[2] (ZRANK, when it is still
-- in the state) or a binary search of the range by rank (when it left): O(log^2 n) plus the
-- ids returned, never a walk over the ids before the page (as ZRANGEBYSCORE ... LIMIT
-- offset does).

local key, code, after, count = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local first = redis.call('ZCOUNT', key, '-inf', '(' .. code)
local stop = first + redis.call('ZCOUNT', key, code, code)

-- Redis orders members of one score bytewise (memcmp); Lua's < may follow the locale.
local function sorts_after(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x > y
    end
  end
  return #a > #b
end

local start = first
if after ~= '' then
  local score = redis.call('ZSCORE', key, after)
  if score and tonumber(score) == tonumber(code) then
    start = redis.call('ZRANK', key, after) + 1
  else
    local lo, hi = first, stop
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if sorts_after(redis.call('ZRANGE', key, mid, mid)[1], after) then
        hi = mid
      else
        lo = mid + 1
      end
    end
    start = lo
  end
end
if start >= stop or count < 1 then
  return {}
end
return redis.call('ZRANGE', key, start, math.min(stop, start + count) - 1)
