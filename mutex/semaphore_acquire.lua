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
local tok, n, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4])
local want = tonumber(ARGV[3])
-- The fast path: an unknown token takes permits that fit, nobody waiting
-- and nothing due to sweep (what the general path below does then, with
-- no table and no closure): ZADD, HSET, and PEXPIREAT of the holders set it
-- creates or of every key when exp moves.
if not v and w == 0 and due > now and (d == 0 or dd > now) and (size == 0 or size == want) and n <= want - held then
  fence = fence + 1
  if fence < now then
    fence = now
  end
  local ends = now + lease
  call('ZADD', HOLD, ends, tok)
  if ends < due then
    due = ends
  end
  local moved = not exists
  if ends > exp then
    exp, moved = ends + floor((ends - now) / 4), true
  end
  call('HSET', H, tok, format('h%d:%d:%d', n, fence, ends), 'held', held + n,
    'm', format('%d:%d:%d:%d:%d:%d', want, fence, seq, due, dd, exp))
  if moved then
    call('PEXPIREAT', H, exp)
    call('PEXPIREAT', HOLD, exp)
    if d > 0 then
      call('PEXPIREAT', DONE, exp)
    end
  elseif held == 0 then -- the holders set is new
    call('PEXPIREAT', HOLD, exp)
  end
  return {1, now, ends, fence}
end
-- general path
if sized and size ~= want then
  return {-1, size}
end
if v == 'd' then
  return {-2, now}
end
size = want
if due <= now or d > 0 and dd <= now then
  drop_expired()
end
if w > 0 and held < size then
  pump(ARGV[7])
end
local p = put[tok]
if p ~= nil then
  v = p
end
local kind = v and string.sub(v, 1, 1)
if kind == 'h' then
  local _, fe, ends = holder(v)
  save()
  if ends <= now then -- ended, not swept yet (a full sweep)
    return {0, now}
  end
  return {1, now, ends, fe}
end
local alive = now + tonumber(ARGV[6])
if kind == 'w' then
  call('ZADD', ALIVE, alive, tok)
  if alive > exp then
    later(alive)
  end
  save()
  return {0, now, tonumber(string.match(v, '(%d+)$'))}
end
-- back: a waiter passed over for polling late, queued again at its place;
-- it takes its permits now if they fit and that place is ahead of the
-- queue's head (at which pump stopped), as pump would have granted them.
local mode = ARGV[5]
local had = tonumber(string.sub(mode, 2)) or 0
local back = had >= 1 and had <= seq and string.sub(mode, 1, 1) == 'w'
if n <= size - held and (w == 0 or back and had < first(QUEUE)) then
  local e, f = grant(tok, n, lease)
  save()
  return {1, now, e, f}
end
if string.sub(mode, 1, 1) == 'w' then
  if w == 0 then
    fresh_queue, fresh_alive = true, true
  end
  if not back then
    seq = seq + 1
    had = seq
  end
  call('ZADD', QUEUE, had, tok)
  call('ZADD', ALIVE, alive, tok)
  w = w + 1
  if alive < due then
    due = alive
  end
  if alive > exp then
    later(alive)
  end
  put[tok] = format('w%d:%d:%d', n, lease, had)
  save()
  return {0, now, had}
end
save()
return {0, now}
