-- release: close one handle of the lock; the last one deletes the lock.
-- KEYS[1] the lock key
-- ARGV[1] token, ARGV[2] handle id
-- Returns the number of handles still open (0: the lock is free now), or -1
-- when this handle does not hold the lock (expired, taken by another owner,
-- or this handle was released already).
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then
  return -1
end
if redis.call('HDEL', KEYS[1], 'h' .. ARGV[2]) == 0 then
  return -1
end
local left = redis.call('HLEN', KEYS[1]) - 1
if left <= 0 then
  redis.call('DEL', KEYS[1])
  return 0
end
return left
