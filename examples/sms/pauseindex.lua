-- pauseindex: add a prefix just paused by the conversion guard to the index
-- of paused prefixes, which the operators' tools list. All in the server's
-- clock. The pauses themselves live under keys of their prefix's hash slot,
-- named by its HMAC (its id); the index lets them be found without a SCAN.
-- KEYS[1] the index: a sorted set, member a prefix's id, score when its
--   pause ends (µs since the epoch)
-- ARGV[1] the id, ARGV[2] the pause (µs), ARGV[3] the most members kept
-- Ended pauses leave the index here; it keeps the ARGV[3] pauses that end
-- last, and expires with the last of them. Returns its size.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -tonumber(ARGV[3]) - 1)
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], math.max(1, math.ceil((tonumber(last[2]) - now) / 1000)))
return redis.call('ZCARD', KEYS[1])
