-- semaphore_acquire: take n permits, or wait in the queue for them
-- (after semaphore.lua, whose KEYS it takes).
-- ARGV[1] token, ARGV[2] n, ARGV[3] size N, ARGV[4] lease ms,
-- ARGV[5] mode: "t" take only if free now (TryAcquire), "w" take or queue,
-- and as a queued waiter poll (Acquire), ARGV[6] a waiter's lease ms,
-- ARGV[7] the grants' Pub/Sub channel
-- Returns {1, now, lease end, fence} when the token holds its permits;
-- {0, now} when a try does not fit; {0, now, seq} for a waiter still queued,
-- seq its place in the FIFO order (the queue's score); {-1, size} when the semaphore has another size in Redis;
-- {-2, now} when the token was released or cancelled already.
-- Safe to run again (a retry after a lost reply): a token that holds its
-- permits is answered so, a queued one is not queued twice, and a token
-- that ended takes nothing.
local tok, n, size, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local stored = redis.call('HGET', H, 'size')
if stored and tonumber(stored) ~= size then
  return {-1, tonumber(stored)}
end
if redis.call('ZSCORE', DONE, tok) then
  return {-2, text(now)}
end
redis.call('HSET', H, 'size', ARGV[3])
drop_expired()
pump(ARGV[7])
local ends = redis.call('ZSCORE', HOLD, tok)
if ends then
  touch()
  return {1, text(now), ends, redis.call('HGET', H, 'f:' .. tok)}
end
local seq = redis.call('ZSCORE', QUEUE, tok)
if seq then
  redis.call('ZADD', ALIVE, text(now + tonumber(ARGV[6])), tok)
  touch()
  return {0, text(now), seq}
end
if redis.call('ZCARD', QUEUE) == 0 and num(redis.call('HGET', H, 'held')) + n <= size then
  local e, f = grant(tok, n, lease)
  touch()
  return {1, text(now), text(e), text(f)}
end
if ARGV[5] == 'w' then
  seq = redis.call('HINCRBY', H, 'seq', 1)
  redis.call('ZADD', QUEUE, seq, tok)
  redis.call('ZADD', ALIVE, text(now + tonumber(ARGV[6])), tok)
  redis.call('HSET', H, 'n:' .. tok, ARGV[2], 'l:' .. tok, ARGV[4])
  touch()
  return {0, text(now), seq}
end
touch()
return {0, text(now)}
