-- fence: Lua functions prepended to the acquire and release scripts.
-- bump_fence(key, keep) returns the next fencing number of a lock: one more
-- than the last, and never less than the server's time in microseconds, so a
-- counter that expired (it lives keep ms after its last use) starts again
-- above every number it gave, unless the server clock moved back by more than
-- keep. keep == 0 turns fencing off and returns 0.
-- last_fence(key, keep) returns the number bump_fence gave last (0 when
-- fencing is off), for an acquire run again by a retry.
local function bump_fence(key, keep)
  if tonumber(keep) == 0 then
    return 0
  end
  local fence = redis.call('INCR', key)
  local t = redis.call('TIME')
  -- Build the time as text: a Lua number would be formatted lossily.
  local now = t[1] .. string.format('%06d', tonumber(t[2]))
  if fence < tonumber(now) then
    redis.call('SET', key, now)
    fence = tonumber(now)
  end
  redis.call('PEXPIRE', key, keep) -- as text: see acquire.lua
  return fence
end

local function last_fence(key, keep)
  if tonumber(keep) == 0 then
    return 0
  end
  return tonumber(redis.call('GET', key)) or 0
end
