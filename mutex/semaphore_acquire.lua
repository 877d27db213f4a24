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
-- read with the scalars.
local tok, n, lease, mode = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4]), ARGV[5]
local want = tonumber(ARGV[3])
-- The fast paths (what the general path below does then, with no closure
-- and no table but the reply), when nothing is due to sweep and the size
-- is right: an unknown token takes permits that fit, nobody waiting
-- (ZADD, HSET); a waiter's poll keeps its place (ZADD), nobody to grant;
-- an unknown token in mode "w" that does not fit queues at the tail
-- (ZADD of each set, HSET). Each moves every key's expiry when its end
-- passes exp.
if due > now and (d == 0 or dd > now) and (size == 0 or size == want) then
  if not v and w == 0 and n <= want - held then
    fence = fence + 1
    if fence < now then
      fence = now
    end
    local e = now + lease
    call('ZADD', ENDS, e, tok)
    if e < due then
      due = e
    end
    local moved = not exists
    if e > exp then
      exp, moved = e + floor((e - now) / 4), true
    end
    call('HSET', H, tok, format('h%d:%d:%d', n, fence, e), 'm', format(M, held + n, w, d, want, fence, seq, due, dd, exp))
    if moved or held == 0 and d == 0 then -- every key, or the ends set is new
      call('PEXPIREAT', ENDS, exp)
      if moved then
        call('PEXPIREAT', H, exp)
      end
    end
    return {1, now, e, fence}
  end
  if v and string.byte(v) == 119 and (w == 0 or held >= size) then -- w
    local alive = now + tonumber(ARGV[6])
    call('ZADD', ENDS, alive, tok)
    if alive > exp then
      exp = alive + floor((alive - now) / 4)
      call('HSET', H, 'm', format(M, held, w, d, size, fence, seq, due == none and 0 or due, dd, exp))
      call('PEXPIREAT', H, exp)
      call('PEXPIREAT', ENDS, exp)
      call('PEXPIREAT', QUEUE, exp)
    end
    return {0, now, tonumber(string.match(v, '(%d+)$'))}
  end
  if not v and mode == 'w' and (w == 0 or held >= want) and (w > 0 or n > want - held) then
    local alive = now + tonumber(ARGV[6])
    seq = seq + 1
    call('ZADD', QUEUE, seq, tok)
    call('ZADD', ENDS, alive, tok)
    if alive < due then
      due = alive
    end
    local moved = not exists
    if alive > exp then
      exp, moved = alive + floor((alive - now) / 4), true
    end
    call('HSET', H, tok, format('w%d:%d:%d', n, lease, seq), 'm', format(M, held, w + 1, d, want, fence, seq, due, dd, exp))
    if moved then
      call('PEXPIREAT', H, exp)
      call('PEXPIREAT', ENDS, exp)
      call('PEXPIREAT', QUEUE, exp)
    else
      if w == 0 then -- the queue is new
        call('PEXPIREAT', QUEUE, exp)
      end
      if held == 0 and w == 0 and d == 0 then -- the ends set is new
        call('PEXPIREAT', ENDS, exp)
      end
    end
    return {0, now, seq}
  end
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
  local _, fe, e = holder(v)
  save()
  if e <= now then -- ended, not swept yet (a full sweep)
    return {0, now}
  end
  return {1, now, e, fe}
end
local alive = now + tonumber(ARGV[6])
if kind == 'w' then
  ends(tok, alive, false)
  later(alive)
  save()
  return {0, now, tonumber(string.match(v, '(%d+)$'))}
end
-- back: a waiter passed over for polling late, queued again at its place;
-- it takes its permits now if they fit and that place is ahead of the
-- queue's head (at which pump stopped), as pump would have granted them.
-- (A token swept just now as an ended holder or waiter is not in the ends
-- set any more: fresh.)
local had = tonumber(string.sub(mode, 2)) or 0
local back = had >= 1 and had <= seq and string.sub(mode, 1, 1) == 'w'
if n <= size - held and (w == 0 or back and had < first(QUEUE)) then
  local e, f = grant(tok, n, lease, true)
  save()
  return {1, now, e, f}
end
if string.sub(mode, 1, 1) == 'w' then
  if w == 0 then
    fresh_queue = true
  end
  if not back then
    seq = seq + 1
    had = seq
  end
  call('ZADD', QUEUE, had, tok)
  ends(tok, alive, true)
  w = w + 1
  if alive < due then
    due = alive
  end
  later(alive)
  put[tok] = format('w%d:%d:%d', n, lease, had)
  save()
  return {0, now, had}
end
save()
return {0, now}
