-- semaphore_release: give back a holder's permits, or take a waiter out of
-- the queue (after semaphore.lua, whose KEYS it takes), then grant the head
-- waiters what now fits (pump).
-- ARGV[1] token, ARGV[2] the grants' Pub/Sub channel, ARGV[3] record ms,
-- ARGV[4] "c" for a cancelled wait (records the token even when it is
-- unknown, so that a late poll of it queues nothing)
-- Returns 1 when the token's permits were released (now, or by a first run
-- of this call that a retry repeats: the token's record), 2 when it was
-- taken out of the queue, 0 when it held nothing (its lease ended).
-- A holder leaves the holders set after pump granted the next ones, so
-- that a hand-off does not empty the set (and set its TTL again).
local tok, rec = ARGV[1], tonumber(ARGV[3])
local ends_record = now + rec
-- The fast path: a holder whose lease has not ended gives its permits
-- back, nobody waiting and nothing due to sweep (what the general path
-- below does then, with no table and no closure): ZADD of its record, ZREM,
-- HSET, and PEXPIREAT of the done set it creates or of every key when exp
-- moves.
if v and w == 0 and due > now and (d == 0 or dd > now) and string.byte(v) == 104 then
  local n, _, ends = string.match(v, '^h(%d+):(%d+):(%d+)$')
  if ends and tonumber(ends) > now then
    held = held - tonumber(n)
    local fresh = d == 0
    if fresh then
      dd = ends_record
    end
    d = d + call('ZADD', DONE, ends_record, tok)
    local moved = not exists
    if ends_record > exp then
      exp, moved = ends_record + floor((ends_record - now) / 4), true
    end
    call('ZREM', HOLD, tok)
    if held == 0 then
      -- Idle: see the general path.
      if exp - ends_record > 2 * rec then
        local last = call('ZRANGE', DONE, -1, -1, 'WITHSCORES')[2]
        local e = math.max(ends_record, tonumber(last) or 0)
        local idle = e + floor((e - now) / 4)
        if exp - idle > rec then
          exp, moved = idle, true
        end
      end
      due = none
    end
    call('HSET', H, tok, 'd', 'held', held, 'd', d,
      'm', format('%d:%d:%d:%d:%d:%d', size, fence, seq, due == none and 0 or due, dd, exp))
    if moved then
      call('PEXPIREAT', H, exp)
      if held > 0 then
        call('PEXPIREAT', HOLD, exp)
      end
      call('PEXPIREAT', DONE, exp)
    elseif fresh then
      call('PEXPIREAT', DONE, exp)
    end
    return 1
  end
end
-- general path
if due <= now or d > 0 and dd <= now then
  drop_expired()
  local p = put[tok]
  if p ~= nil then
    v = p
  end
end
if v == 'd' then
  save()
  return 1
end
local kind, res, leave = v and string.sub(v, 1, 1), 0, false
-- record remembers tok as ended until ends_record; the first record sets
-- when done is swept (dd), later ones wait for the sweep dd names.
local record = false
if kind == 'h' then
  local n, _, ends = holder(v)
  held = held - n
  leave = true
  if ends > now then
    record, res = true, 1
  else -- ended, not swept yet (a full sweep): swept now
    put[tok] = false
  end
elseif kind == 'w' then
  call('ZREM', QUEUE, tok)
  w = w - call('ZREM', ALIVE, tok)
  record, res = true, 2
end
if res == 0 and ARGV[4] == 'c' then
  record = true
end
if record then
  if d == 0 then
    fresh_done = true
    dd = ends_record
  end
  d = d + call('ZADD', DONE, ends_record, tok)
  put[tok] = 'd'
  if ends_record > exp then
    later(ends_record)
  end
end
if w > 0 and held < size then
  pump(ARGV[2])
end
if leave then
  call('ZREM', HOLD, tok)
  hset = held > 0
end
-- Idle now (nothing held, nobody queued): only the records are left, so a
-- far exp that a long lease set comes back to the latest record's end (a
-- semaphore released after a lease of a day does not keep its keys for a
-- day). Tested first against this release's record, with no command.
if held == 0 and w == 0 then
  if exp - ends_record > 2 * rec then
    local last = call('ZRANGE', DONE, -1, -1, 'WITHSCORES')[2]
    local e = math.max(ends_record, tonumber(last) or 0)
    local idle = e + floor((e - now) / 4)
    if exp - idle > rec then
      exp = idle
      every = true
    end
  end
  due = none -- nothing to sweep but records (dd)
end
save()
return res
