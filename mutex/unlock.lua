-- unlock: the common release in its shortest form: the last handle of a
-- lock that was never re-entered, or whose re-entries all closed (the
-- root handle, 0, alone open), with no local owner to hand it to and no
-- fencing. It deletes the lock, publishes the release if a waiter marked
-- it, and leaves the release's record exactly as release.lua would for the
-- same call ("r0>": handle 0, no next owner), with record.lua's steps
-- written out here: this script is most releases, and a Lua function call
-- and its arguments cost it a good part of its time.
-- KEYS[1] the lock key, KEYS[2] the name's release record key, KEYS[3] the
-- token's; ARGV[1] the value of the lock as a native SET NX took it (no
-- waiter's mark, no list), ARGV[2] the caller's owner, ARGV[3] the release's
-- record, ARGV[4] the owner followed by the caller's mark (record.lua: a
-- record of this owner numbered below the mark may be overwritten). The
-- caller builds the record, so the script concatenates nothing. record_px
-- and record_keep (record.lua) are set before these lines, and
-- value_root_only (value.lua) too.
-- Returns 0 when it released the lock; 2 when the lock is not in that
-- shape or not held by token (taken, expired, released already: a retry
-- whose first run succeeded): the caller then runs release.lua, which
-- handles every other case and answers a retry from the record.
local v = redis.call('GET', KEYS[1])
local marked = false
if v ~= ARGV[1] then
  -- Not the value a native SET NX left: a marked lock, a re-entered one
  -- whose handles closed, or not this token's lock.
  local root_only
  root_only, marked = value_root_only(v, ARGV[1])
  if not root_only then
    return 2
  end
end
redis.call('DEL', KEYS[1])
if marked then -- a waiter asked to hear of it
  redis.call('PUBLISH', string.sub(KEYS[1], 1, -5) .. 'released', '1')
end
-- The record of the name's key may be overwritten when it is this owner's
-- and numbered below the mark: owner <= old < owner .. mark, as text (a
-- record starts with its owner and number, lower-case hex digits of one
-- width, so text order is number order; record.lua's test, without cutting
-- old).
local old = redis.call('SET', KEYS[2], ARGV[3], 'PX', record_keep, 'GET')
if old and (old < ARGV[2] or old >= ARGV[4]) then
  redis.call('SET', KEYS[2], old, 'KEEPTTL')
  redis.call('SET', KEYS[3], ARGV[3], 'PX', record_px)
end
return 0
