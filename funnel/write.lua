-- write: store the rules' new state; run only while the lock is held (see
-- mutex.Lock.UnlockWith).
-- KEYS[1] the state hash
-- ARGV[1] TTL in ms: until every written funnel is empty; then field, value
-- pairs (an empty value deletes the field).
-- The key's TTL only grows: fields of other rules may need the longer one.
local empty = false
for i = 3, #ARGV, 2 do
  if ARGV[i] == '' then
    empty = true
    break
  end
end
if not empty then
  -- Every admission: one HSET for all the rules.
  redis.call('HSET', KEYS[1], unpack(ARGV, 2))
else
  for i = 2, #ARGV, 2 do
    if ARGV[i + 1] == '' then
      redis.call('HDEL', KEYS[1], ARGV[i])
    else
      redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    end
  end
end
local ttl = tonumber(ARGV[1])
if ttl > 0 and redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 1
