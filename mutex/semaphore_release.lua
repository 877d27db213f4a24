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
local v = load(tok)
drop_expired()
v = state(tok, v)
if v == 'd' then
  save()
  return 1
end
local kind, res, leave = v and string.sub(v, 1, 1), 0, false
if kind == 'h' then
  local n, _, ends = holder(v)
  S.held = S.held - n
  leave = true
  if ends > now then
    record(tok, ends_record)
    res = 1
  else -- ended, not swept yet (a full sweep): swept now
    put[tok] = false
  end
elseif kind == 'w' then
  call('ZREM', QUEUE, tok)
  S.w = S.w - call('ZREM', ALIVE, tok)
  record(tok, ends_record)
  res = 2
end
if res == 0 and ARGV[4] == 'c' then
  record(tok, ends_record)
end
pump(ARGV[2])
if leave then
  call('ZREM', HOLD, tok)
  held = S.held > 0
end
-- Idle now (nothing held, nobody queued): only the records are left, so a
-- far exp that a long lease set comes back to the latest record's end (a
-- semaphore released after a lease of a day does not keep its keys for a
-- day). Tested first against this release's record, with no command.
if S.held == 0 and S.w == 0 and S.exp - ends_record > 2 * rec then
  local last = call('ZRANGE', DONE, -1, -1, 'WITHSCORES')[2]
  local e = math.max(ends_record, tonumber(last) or 0)
  local idle = e + math.floor((e - now) / 4)
  if S.exp - idle > rec then
    S.exp = idle
    every = true
  end
end
if S.held == 0 and S.w == 0 then
  S.due = none -- nothing to sweep but records (dd)
end
save()
return res
