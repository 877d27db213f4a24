-- unlock: the common release in its shortest form: the last handle of a
-- lock that was never re-entered, or whose re-entries all closed (the
-- root handle, 0, alone open), with no local owner to hand it to and no
-- fencing. It deletes the lock, publishes the release if a waiter marked
-- it, and leaves the release's record exactly as release.lua would for the
-- same call ("r0>": handle 0, no next owner), with record.lua's steps
-- written out here: this script is most releases, and a Lua function call
-- and its arguments cost it a good part of its time.
-- KEYS[1] the lock key, KEYS[2] the name's release record key, KEYS[3] the
-- token's; ARGV[1] token, ARGV[2..4] the caller's stamp: owner, seq, mark
-- (record.lua). record_px and record_keep (record.lua) are set before these
-- lines.
-- Returns 0 when it released the lock; 2 when the lock is not in that
-- shape or not held by token (taken, expired, released already: a retry
-- whose first run succeeded): the caller then runs release.lua, which
-- handles every other case and answers a retry from the record.
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 32) ~= ARGV[1] or (#v ~= 33 and string.sub(v, 34) ~= ':,0,') then
  return 2
end
redis.call('DEL', KEYS[1])
if string.byte(v, 33) == 119 then -- 'w': a waiter asked to hear of it
  redis.call('PUBLISH', string.sub(KEYS[1], 1, -5) .. 'released', '1')
end
local owner = ARGV[2]
local rec = owner .. ARGV[3] .. ':' .. ARGV[1] .. ':r0>:0:0:f'
local old = redis.call('SET', KEYS[2], rec, 'PX', record_keep, 'GET')
if old and (string.sub(old, 1, 16) ~= owner or string.sub(old, 17, 32) >= ARGV[4]) then
  redis.call('SET', KEYS[2], old, 'KEEPTTL')
  redis.call('SET', KEYS[3], rec, 'PX', record_px)
end
return 0
