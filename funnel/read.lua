-- read: the state of a key's rules, with the server time, and whether the
-- call may go on to take the lock (a gate, see mutex.NewGate).
-- KEYS[1] the state hash
-- ARGV the rules' fields
-- Returns {proceed, {now µs, value...}}: proceed is 0 when a rule has no room
-- for one unit now (its stored free time is past both now and its stored
-- time), so the call is denied without the lock. A value is
-- "<free>:<fill>:<at>", or false for an empty funnel.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local values = redis.call('HMGET', KEYS[1], unpack(ARGV))
local proceed = 1
for i = 1, #ARGV do
  local v = values[i]
  local free, at
  if v then
    free, at = string.match(v, '^(%d+):%d+:(%d+)$')
  end
  -- A rule's clock never goes back: before its stored time, no leak counts.
  if free and tonumber(free) > math.max(now, tonumber(at)) then
    proceed = 0
  end
end
return {proceed, {now, unpack(values)}}
