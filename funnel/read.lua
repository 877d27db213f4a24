-- read: the state of a key's rules, with the server time, and whether the
-- call may go on to take the lock (a gate, see mutex.NewGate).
-- KEYS[1] the state hash
-- ARGV the rules' fields
-- Returns {proceed, now µs, value...}: proceed is 0 when a rule has no room
-- for one unit now (TIME is before its stored gate time), so the call is
-- denied without the lock. A value is "<gate>:<fill>:<at>", or false for an
-- empty funnel; its numbers are in base 36. Only the gate is parsed here: a
-- plain find and one number (Redis runs this script for every call, denied
-- ones included).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local values = redis.call('HMGET', KEYS[1], unpack(ARGV))
local proceed = 1
for i = 1, #values do
  local v = values[i]
  if v then
    local c = string.find(v, ':', 1, true)
    -- A value that does not parse proceeds: the caller reports it corrupt.
    if c and (tonumber(string.sub(v, 1, c - 1), 36) or 0) > now then
      proceed = 0
      break -- one full rule denies: the others need no parsing here
    end
  end
end
return {proceed, now, unpack(values)}
