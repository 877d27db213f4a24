-- acquire: take the lock, or re-enter it, and set its lease.
-- The lock is a hash: field "t" is the owner's token, each open handle of that
-- owner has a field "h<id>" (so a release is idempotent per handle), and "w"
-- marks that a waiter wants to hear of the release.
-- KEYS[1] the lock key, KEYS[2] the fencing counter key
-- ARGV[1] token, ARGV[2] handle id, ARGV[3] lease in ms,
-- ARGV[4] "1" to re-enter a lock this token holds (never creates one),
-- ARGV[5] "1" to mark a waiter on failure, ARGV[6] fencing counter TTL in ms (0: off)
-- Returns {1, lease ms, fence} when this token holds the lock now;
-- {0, PTTL, 0} when it does not (PTTL is -2 when re-entry found no lock).
local owner = redis.call('HGET', KEYS[1], 't')
local lease = tonumber(ARGV[3])
if not owner then
  if ARGV[4] == '1' then
    return {0, -2, 0}
  end
  redis.call('HSET', KEYS[1], 't', ARGV[1], 'h' .. ARGV[2], 1)
  redis.call('PEXPIRE', KEYS[1], lease)
  return {1, lease, bump_fence(KEYS[2], ARGV[6])}
end
if owner == ARGV[1] and ARGV[4] == '1' then
  redis.call('HSET', KEYS[1], 'h' .. ARGV[2], 1)
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl < lease then
    redis.call('PEXPIRE', KEYS[1], lease)
    pttl = lease
  end
  return {1, pttl, 0}
end
if ARGV[5] == '1' then
  redis.call('HSET', KEYS[1], 'w', 1)
end
return {0, redis.call('PTTL', KEYS[1]), 0}
