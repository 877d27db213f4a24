-- release: close one handle of the lock. When it was the last one, either
-- hand the lock to a next local owner (a fresh token, a fresh lease, in the
-- same step, so nobody else can slip in) or delete it and, if a waiter marked
-- the lock, publish the release.
-- KEYS[1] the lock key, KEYS[2] the fencing counter key
-- ARGV[1] token, ARGV[2] handle id, ARGV[3] next owner's token ("" for none),
-- ARGV[4] next owner's lease in ms, ARGV[5] release channel,
-- ARGV[6] fencing counter TTL in ms (0: off)
-- Returns {handles left, fence}: handles left is -1 when this handle does not
-- hold the lock (expired, taken, released already), 0 when the last handle
-- closed (and the lock went to the next owner if one was given, with that
-- fence), more while re-entrant handles stay open.
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then
  return {-1, 0}
end
if redis.call('HDEL', KEYS[1], 'h' .. ARGV[2]) == 0 then
  return {-1, 0}
end
local marked = redis.call('HEXISTS', KEYS[1], 'w')
local left = redis.call('HLEN', KEYS[1]) - 1 - marked
if left > 0 then
  return {left, 0}
end
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 't', ARGV[3], 'h0', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return {0, bump_fence(KEYS[2], ARGV[6])}
end
redis.call('DEL', KEYS[1])
if marked == 1 then
  redis.call('PUBLISH', ARGV[5], '1')
end
return {0, 0}
