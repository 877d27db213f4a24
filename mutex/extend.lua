-- extend: set the remaining lease of a lock that this owner holds.
-- KEYS[1] the lock key
-- ARGV[1] token, ARGV[2] handle id ("" for any handle of the owner: renewal),
-- ARGV[3] new lease in ms
-- Returns 1 when the lease was set, 0 when the lock is not held.
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then
  return 0
end
if ARGV[2] ~= '' and redis.call('HEXISTS', KEYS[1], 'h' .. ARGV[2]) == 0 then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
