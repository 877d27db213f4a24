-- extend: set the remaining lease of a lock that this owner holds.
-- KEYS[1] the lock key
-- ARGV[1] token, ARGV[2] handle id ("" for any handle of the owner: renewal),
-- ARGV[3] new lease in ms
-- Returns 1 when the lease was set, 0 when the lock is not held.
if not held(KEYS[1], ARGV[1], ARGV[2]) then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
