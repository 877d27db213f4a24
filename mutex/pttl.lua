-- pttl: the remaining lease of a lock that this handle holds.
-- KEYS[1] the lock key
-- ARGV[1] token, ARGV[2] handle id
-- Returns the remaining lease in ms, or -3 when this handle does not hold the lock.
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] or redis.call('HEXISTS', KEYS[1], 'h' .. ARGV[2]) == 0 then
  return -3
end
return redis.call('PTTL', KEYS[1])
