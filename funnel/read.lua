-- read: the state of a key's rules, with the server time, and whether the
-- call may go on to take the lock (a gate, see mutex.NewGate). Its three
-- functions come first in every script that reads the state; alone, it is
-- read_state(#ARGV) (limiter.go).
-- KEYS[1] the state hash
-- ARGV the rules' fields: the first nf (all when nf is nil), a caller's
-- arguments after them
-- read_state returns {proceed, now µs, value...}: proceed is 0 when a rule
-- has no room for one unit now (TIME is before its gate, <at> + <wait>), so
-- the call is denied without the lock. A value is
-- "<wait>:<fill>:<at>[:<nonce>]" in base 36, or false for an empty funnel.
-- Only the wait is parsed, and <at> when the wait is not 0 (Redis runs this
-- for every call, denied ones included). read_values is its two commands,
-- read_reply the rest, for returning.lua, which needs the reply only when
-- the values are not those it expected.
local function read_values(nf)
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2]), redis.call('HMGET', KEYS[1], unpack(ARGV, 1, nf))
end

local function read_reply(now, values)
  local proceed = 1
  for i = 1, #values do
    local v = values[i]
    if v then
      local c = string.find(v, ':', 1, true)
      -- A value that does not parse proceeds: the caller reports it corrupt.
      local wait = c and tonumber(string.sub(v, 1, c - 1), 36) or 0
      if wait > 0 then
        local c2 = string.find(v, ':', c + 1, true)
        local c3 = c2 and string.find(v, ':', c2 + 1, true)
        local at = c2 and tonumber(string.sub(v, c2 + 1, (c3 or 0) - 1), 36)
        if at and at + wait > now then
          proceed = 0
          break -- one full rule denies: the others need no parsing here
        end
      end
    end
  end
  return {proceed, now, unpack(values)}
end

local function read_state(nf)
  return read_reply(read_values(nf))
end
