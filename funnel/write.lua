-- write: store the rules' new state; run only while the lock is held (see
-- mutex.Lock.UnlockWith).
-- KEYS[1] the state hash
-- ARGV[1] TTL in ms: until every written funnel is empty; ARGV[2] the
-- deadline: the server time (µs) from which a caller whose units this
-- write carries may have given up, 0 for none; then field, value pairs (an
-- empty value deletes the field).
-- Returns 1 when written; minus the server time when it ran at or past its
-- deadline: then it writes nothing (its callers have an error, or will).
-- The key's TTL only grows: fields of other rules may need the longer one.
local deadline = tonumber(ARGV[2])
if deadline > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if now >= deadline then
    return -now
  end
end
local empty = false
for i = 4, #ARGV, 2 do
  if ARGV[i] == '' then
    empty = true
    break
  end
end
if not empty then
  -- Every admission: one HSET for all the rules.
  redis.call('HSET', KEYS[1], unpack(ARGV, 3))
else
  for i = 3, #ARGV, 2 do
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
