-- release: close one handle of the lock. When it was the last one, either
-- hand the lock to a next local owner (a fresh token, a fresh lease, in the
-- same step, so nobody else can slip in; a waiter's mark stays) or delete it
-- and, if a waiter marked the lock, publish the release.
-- KEYS[1] the lock key, KEYS[2] the name's release record key and KEYS[3]
-- the token's (record.lua), KEYS[4] the fencing counter key (with fencing
-- only)
-- ARGV[1] token, ARGV[2] handle id, ARGV[3] next owner's token ("" for none;
-- after UNLESS_MARKED: only if no waiter marked the lock, else release it to
-- all comers, as a chain of local hand-overs ends: release.go's passing),
-- ARGV[4] next owner's lease in ms, ARGV[5] fencing counter TTL in ms (0: off),
-- ARGV[6..8] the caller's stamp: owner, seq, mark (record.lua).
-- The release channel is the lock key with "released" for "lock" (see
-- Locker.channel).
-- Returns {handles left, fence}: handles left is -1 when this handle does not
-- hold the lock (expired, taken, released already), 0 when the last handle
-- closed (and the lock went to the next owner if one was given, with that
-- fence), more while re-entrant handles stay open; a third element, YIELDED,
-- says that a hand-over UNLESS_MARKED found the lock marked and released it
-- to all instead. A release run again after
-- it succeeded returns the first run's reply from its record, with a result
-- and a replay flag (recall). The caller computes release_call before it,
-- and writes the record (record).
local v = held(KEYS[1], ARGV[1], ARGV[2])
if not v then
  return recall(KEYS[2], KEYS[3], ARGV[1], release_call) or {-1, 0}
end
-- Close the handle: while others stay open (re-entries), that is all.
local rest, left = value_without_handle(v, ARGV[2])
if rest then
  redis.call('SET', KEYS[1], rest, 'KEEPTTL')
  return {left, 0}
end
local marked = value_marked(v)
local nxt, yielded = ARGV[3], nil
if string.sub(nxt, 1, 1) == UNLESS_MARKED then
  nxt = string.sub(nxt, 2)
  if marked then
    nxt, yielded = '', YIELDED
  end
end
if nxt ~= '' then
  -- The next owner's value keeps the waiter's mark.
  redis.call('SET', KEYS[1], value_new(nxt, marked), 'PX', ARGV[4])
  return {0, bump_fence(KEYS[4], ARGV[5])}
end
redis.call('DEL', KEYS[1])
if marked then
  redis.call('PUBLISH', string.sub(KEYS[1], 1, -5) .. 'released', '1')
end
return {0, 0, yielded}
