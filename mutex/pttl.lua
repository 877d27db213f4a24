-- pttl: the remaining lease of a lock that this handle holds.
-- KEYS[1] the lock key
-- ARGV[1] token, ARGV[2] handle id
-- Returns the remaining lease in ms, or -3 when this handle does not hold the lock.
if not held(KEYS[1], ARGV[1], ARGV[2]) then
  return -3
end
return redis.call('PTTL', KEYS[1])
