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
local ends_record = now + tonumber(ARGV[3])
local v = load({'n:' .. tok})
drop_expired()
local ends = S.held > 0 and redis.call('ZSCORE', HOLD, tok)
local res = 0
if ends and tonumber(ends) > now then
  redis.call('ZREM', HOLD, tok)
  S.held = S.held - num(v[1])
  forget(tok)
  record(tok, ends_record)
  res = 1
elseif S.w > 0 and redis.call('ZREM', QUEUE, tok) == 1 then
  S.w = S.w - redis.call('ZREM', ALIVE, tok)
  forget(tok)
  record(tok, ends_record)
  res = 2
elseif S.d > 0 and redis.call('ZSCORE', DONE, tok) then
  save()
  return 1
elseif ARGV[4] == 'c' then
  record(tok, ends_record)
end
pump(ARGV[2])
-- Idle now (nothing held, nobody queued): only the records are left, so a
-- far exp that a long lease set comes back to the latest record's end (a
-- semaphore released after a lease of a day does not keep its keys for a
-- day). Tested first against this release's record, with no command.
if S.held == 0 and S.w == 0 and S.exp - ends_record > 2 * tonumber(ARGV[3]) then
  local last = redis.call('ZRANGE', DONE, -1, -1, 'WITHSCORES')[2]
  local e = math.max(ends_record, tonumber(last) or 0)
  local idle = e + math.floor((e - now) / 4)
  if S.exp - idle > tonumber(ARGV[3]) then
    S.exp = idle
    every = true
  end
end
save()
return res
