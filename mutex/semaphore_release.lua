-- semaphore_release: give back a holder's permits, or take a waiter out of
-- the queue (after semaphore.lua, whose KEYS it takes), then grant the head
-- waiters what now fits (pump).
-- ARGV[1] token, ARGV[2] the grants' Pub/Sub channel, ARGV[3] record ms,
-- ARGV[4] "c" for a cancelled wait (records the token even when it is
-- unknown, so that a late poll of it queues nothing)
-- Returns 1 when the token's permits were released (now, or by a first run
-- of this call that a retry repeats: the token's record), 2 when it was
-- taken out of the queue, 0 when it held nothing (its lease ended).
local tok = ARGV[1]
local record = text(now + tonumber(ARGV[3]))
drop_expired()
local ends = redis.call('ZSCORE', HOLD, tok)
local res = 0
if ends and tonumber(ends) > now then
  local n = num(redis.call('HGET', H, 'n:' .. tok))
  redis.call('ZREM', HOLD, tok)
  forget(tok)
  redis.call('HINCRBY', H, 'held', -n)
  redis.call('ZADD', DONE, record, tok)
  res = 1
elseif redis.call('ZSCORE', QUEUE, tok) then
  redis.call('ZREM', QUEUE, tok)
  redis.call('ZREM', ALIVE, tok)
  forget(tok)
  redis.call('ZADD', DONE, record, tok)
  res = 2
elseif redis.call('ZSCORE', DONE, tok) then
  return 1
elseif ARGV[4] == 'c' then
  redis.call('ZADD', DONE, record, tok)
end
pump(ARGV[2])
touch()
return res
