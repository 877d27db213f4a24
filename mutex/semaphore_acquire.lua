-- semaphore_acquire: take n permits, or wait in the queue for them
-- (after semaphore.lua, whose KEYS it takes).
-- ARGV[1] token, ARGV[2] n, ARGV[3] size N, ARGV[4] lease ms,
-- ARGV[5] mode: "t" take only if free now (TryAcquire), "w" take or queue,
-- and as a queued waiter poll (Acquire); "w<seq>" is "w" for a waiter that
-- was queued at place seq: passed over for polling late (its wait lease
-- ended), it queues again at that place, not at the tail (a place from
-- before the queue's numbering restarted, above seq, is the tail),
-- ARGV[6] a waiter's lease ms, ARGV[7] the grants' Pub/Sub channel
-- Returns {1, now, lease end, fence} when the token holds its permits;
-- {0, now} when a try does not fit; {0, now, seq} for a waiter still queued,
-- seq its place in the FIFO order (the queue's score); {-1, size} when the semaphore has another size in Redis;
-- {-2, now} when the token was released or cancelled already.
-- Safe to run again (a retry after a lost reply): a token that holds its
-- permits is answered so, a queued one is not queued twice, and a token
-- that ended takes nothing. The token's state is its field in the hash,
-- read with the scalars: the uncontended path runs TIME, HMGET, ZADD and
-- HSET (and PEXPIREAT on the holders set it creates).
local tok, n, size, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local mode, had = string.sub(ARGV[5], 1, 1), tonumber(string.sub(ARGV[5], 2)) or 0
local v = load(tok)
if S.sized and S.size ~= size then
  return {-1, S.size}
end
if v == 'd' then
  return {-2, now}
end
S.size = size
drop_expired()
pump(ARGV[7])
v = state(tok, v)
local kind = v and string.sub(v, 1, 1)
if kind == 'h' then
  local _, fence, ends = holder(v)
  save()
  if ends <= now then -- ended, not swept yet (a full sweep)
    return {0, now}
  end
  return {1, now, ends, fence}
end
local alive = now + tonumber(ARGV[6])
if kind == 'w' then
  call('ZADD', ALIVE, text(alive), tok)
  later(alive)
  save()
  return {0, now, tonumber(string.match(v, '(%d+)$'))}
end
-- back: a waiter passed over for polling late, queued again at its place;
-- it takes its permits now if they fit and that place is ahead of the
-- queue's head (at which pump stopped), as pump would have granted them.
local back = mode == 'w' and had >= 1 and had <= S.seq
if n <= size - S.held and (S.w == 0 or back and had < first(QUEUE)) then
  local e, f = grant(tok, n, lease)
  save()
  return {1, now, e, f}
end
if mode == 'w' then
  if S.w == 0 then
    fresh.queue, fresh.alive = true, true
  end
  if not back then
    S.seq = S.seq + 1
    had = S.seq
  end
  call('ZADD', QUEUE, text(had), tok)
  call('ZADD', ALIVE, text(alive), tok)
  S.w = S.w + 1
  S.due = math.min(S.due, alive)
  later(alive)
  put[tok] = string.format('w%d:%d:%d', n, lease, had)
  save()
  return {0, now, had}
end
save()
return {0, now}
