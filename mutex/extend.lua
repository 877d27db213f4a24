-- extend: set the remaining lease of a lock that this handle holds.
-- KEYS[1] the lock key
-- ARGV[1] token, ARGV[2] handle id, ARGV[3] new lease in ms
-- Returns 1 when the lease was set, 0 when this handle does not hold the lock.
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] or redis.call('HEXISTS', KEYS[1], 'h' .. ARGV[2]) == 0 then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
