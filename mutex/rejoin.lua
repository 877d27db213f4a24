-- rejoin: a gate run with each acquire attempt of a quorum Locker made with
-- WithRejoinDelay. It keeps a node that started empty out of every majority
-- until the delay has passed on its clock, so locks it forgot have expired
-- on the other nodes before it grants new ones.
-- KEYS[1] the node's marker: the server time (ms) it was first seen
-- ARGV[1] the delay in ms, ARGV[2] the marker's TTL in ms (refreshed on use)
-- Returns {proceed, ms until this node may grant locks}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local since = tonumber(redis.call('GET', KEYS[1]))
if since then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
  since = now
  redis.call('SET', KEYS[1], now, 'PX', ARGV[2])
end
local wait = since + tonumber(ARGV[1]) - now
if wait > 0 then
  return {0, wait}
end
return {1, 0}
