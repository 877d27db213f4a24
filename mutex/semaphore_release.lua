-- semaphore_release: give back a holder's permits, or take a waiter out of
-- the queue (after semaphore.lua, whose KEYS it takes), then grant the head
-- waiters what now fits (pump).
-- ARGV[1] token, ARGV[2] the grants' Pub/Sub channel, ARGV[3] record ms,
-- ARGV[4] "c" for a cancelled wait (records the token even when it is
-- unknown, so that a late poll of it queues nothing)
-- Returns 1 when the token's permits were released (now, or by a first run
-- of this call that a retry repeats: the token's record), 2 when it was
-- taken out of the queue, 0 when it held nothing (its lease ended).
-- The token's record is its new score in the ends set (one ZADD), so a
-- hand-off does not empty the set (and set its TTL again).
local tok, rec = ARGV[1], tonumber(ARGV[3])
local ends_record = now + rec
-- The fast path: a holder whose lease has not ended gives its permits
-- back and the head waiters that now fit are granted them, nothing due to
-- sweep (what the general path below does then, with no closure): one ZADD
-- of its record and the grants, HSET, and per waiter granted ZPOPMIN and
-- HGET, one PUBLISH for them all; PEXPIREAT of every key when exp moves.
if v and due > now and (d == 0 or dd > now) and string.byte(v) == 104 then -- h
  local n, _, e = string.match(v, '^h(%d+):(%d+):(%d+)$')
  if e and tonumber(e) > now then
    held = held - tonumber(n)
    if d == 0 then
      dd = ends_record
    end
    d = d + 1
    local moved = not exists
    if ends_record > exp then
      exp, moved = ends_record + floor((ends_record - now) / 4), true
    end
    -- zs, hs: the ZADD and HSET of a release that grants (made at its first
    -- grant: an uncontended release makes no table)
    local zs, hs, out, requeued = nil, nil, nil, false
    for _ = 1, sweep do -- pump, inline
      if w == 0 or held >= size then
        break
      end
      local head = call('ZPOPMIN', QUEUE)
      local h = head[1]
      if not h then
        break
      end
      local wn, wl = string.match(call('HGET', H, h) or '', '^w(%d+):(%d+):')
      wn = tonumber(wn) or 0
      if wn > size - held then
        requeued = w == 1 -- popping the last one deleted the queue
        call('ZADD', QUEUE, head[2], h)
        break
      end
      w = w - 1
      if wn > 0 then
        fence = fence + 1
        if fence < now then
          fence = now
        end
        local ge = now + tonumber(wl)
        if not zs then
          zs, hs = {ENDS, rec0 + ends_record, tok}, {H, tok, 'd'}
        end
        zs[#zs + 1], zs[#zs + 2] = ge, h
        hs[#hs + 1], hs[#hs + 2] = h, format('h%d:%d:%d', wn, fence, ge)
        held = held + wn
        if ge < due then
          due = ge
        end
        if ge > exp then
          exp, moved = ge + floor((ge - now) / 4), true
        end
        out = out or {}
        out[#out + 1] = format('%s:%d:%d', h, ge, fence)
      else -- no waiter's field: not a waiter any more
        call('ZREM', ENDS, h)
        call('HDEL', H, h)
      end
    end
    if held == 0 and w == 0 then
      -- Idle: see the general path.
      if exp - ends_record > 2 * rec then
        local last = call('ZRANGE', ENDS, -1, -1, 'WITHSCORES')[2]
        local l = math.max(ends_record, (tonumber(last) or rec0) - rec0)
        local idle = l + floor((l - now) / 4)
        if exp - idle > rec then
          exp, moved = idle, true
        end
      end
      due = none
    end
    local m = format(M, held, w, d, size, fence, seq, due == none and 0 or due, dd, exp)
    if zs then
      call('ZADD', unpack(zs))
      hs[#hs + 1], hs[#hs + 2] = 'm', m
      call('HSET', unpack(hs))
    else
      call('ZADD', ENDS, rec0 + ends_record, tok)
      call('HSET', H, tok, 'd', 'm', m)
    end
    if out then
      call('PUBLISH', ARGV[2], table.concat(out, ','))
    end
    if moved then
      call('PEXPIREAT', H, exp)
      call('PEXPIREAT', ENDS, exp)
      if w > 0 then
        call('PEXPIREAT', QUEUE, exp)
      end
    elseif requeued then
      call('PEXPIREAT', QUEUE, exp)
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
local kind, res = v and string.sub(v, 1, 1), 0
if kind == 'h' then
  local n, _, e = holder(v)
  held = held - n
  if e > now then
    record(tok, ends_record, false)
    res = 1
  elseif ARGV[4] ~= 'c' then -- ended, not swept yet (a full sweep): swept now
    call('ZREM', ENDS, tok)
    put[tok] = false
  end
elseif kind == 'w' then
  w = w - call('ZREM', QUEUE, tok)
  record(tok, ends_record, false)
  res = 2
end
if res == 0 and ARGV[4] == 'c' then
  record(tok, ends_record, kind ~= 'h')
end
if w > 0 and held < size then
  pump(ARGV[2])
end
-- Idle now (nothing held, nobody queued): only the records are left, so a
-- far exp that a long lease set comes back to the latest record's end (a
-- semaphore released after a lease of a day does not keep its keys for a
-- day). Tested first against this release's record, with no command (the
-- last member of the ends set is the latest record but this call's, which
-- save writes). The fast path repeats this inline: it makes no closure.
if held == 0 and w == 0 then
  if exp - ends_record > 2 * rec then
    local last = call('ZRANGE', ENDS, -1, -1, 'WITHSCORES')[2]
    local l = math.max(ends_record, (tonumber(last) or rec0) - rec0)
    local idle = l + floor((l - now) / 4)
    if exp - idle > rec then
      exp = idle
      every = true
    end
  end
  due = none -- nothing to sweep but records (dd)
end
save()
return res
