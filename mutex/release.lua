-- release: close one handle of the lock. When it was the last one, either
-- hand the lock to a next local owner (a fresh token, a fresh lease, in the
-- same step, so nobody else can slip in) or delete it and, if a waiter marked
-- the lock, publish the release.
-- KEYS[1] the lock key, KEYS[2] the fencing counter key
-- ARGV[1] token, ARGV[2] handle id, ARGV[3] next owner's token ("" for none),
-- ARGV[4] next owner's lease in ms, ARGV[5] unused (the release channel is
-- the lock key with "released" for "lock", see Locker.channel),
-- ARGV[6] fencing counter TTL in ms (0: off)
-- Returns {handles left, fence}: handles left is -1 when this handle does not
-- hold the lock (expired, taken, released already), 0 when the last handle
-- closed (and the lock went to the next owner if one was given, with that
-- fence), more while re-entrant handles stay open.
local f = redis.call('HMGET', KEYS[1], 't', 'w', 'h' .. ARGV[2])
if f[1] ~= ARGV[1] or not f[3] then
  return {-1, 0}
end
local marked = f[2] and 1 or 0
-- Open handles other than this one: the fields minus t, w and this handle.
local left = redis.call('HLEN', KEYS[1]) - 2 - marked
if left > 0 then
  redis.call('HDEL', KEYS[1], 'h' .. ARGV[2])
  return {left, 0}
end
if ARGV[3] ~= '' then
  redis.call('HDEL', KEYS[1], 'h' .. ARGV[2])
  redis.call('HSET', KEYS[1], 't', ARGV[3], 'h0', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return {0, bump_fence(KEYS[2], ARGV[6])}
end
redis.call('DEL', KEYS[1])
if marked == 1 then
  redis.call('PUBLISH', string.sub(KEYS[1], 1, -5) .. 'released', '1')
end
return {0, 0}
