-- penalty: Allow's gate with a penalty box (WithPenalty). It reads the
-- state as read.lua does (read_state, that file's body as a function, runs
-- first), then the box: the field '!p' of the state hash, "<count>:<since>:
-- <until>" in base 36 (µs of server time). A key in the box is denied until
-- <until> whatever its rules say. A call its rules deny is counted: the
-- count restarts when <since> + window has passed, and the denials-th one
-- within the window puts the key in the box for box µs. The field is only
-- ever written here, in one script, so it needs no lock; a Reset deletes it
-- with the rest of the state, a Refund leaves it.
-- KEYS[1] the state hash
-- ARGV the rules' fields (k of them); then denials, window µs, box µs, and
-- 1 to count this call's denial (Allow) or 0 not to (Peek).
-- Returns read.lua's reply, with the box's end appended when the key is in
-- the box (an extra element, after the values).
local n = #ARGV
local denials, window, box = tonumber(ARGV[n - 3]), tonumber(ARGV[n - 2]), tonumber(ARGV[n - 1])
local counts = ARGV[n] == '1'
for i = n, n - 3, -1 do
  ARGV[i] = nil
end
local r = read_state()
local now = r[2]
local p = redis.call('HGET', KEYS[1], '!p')
local count, since, till = 0, now, 0
if p then
  local c1 = string.find(p, ':', 1, true)
  local c2 = c1 and string.find(p, ':', c1 + 1, true)
  if c2 then
    count = tonumber(string.sub(p, 1, c1 - 1), 36) or 0
    since = tonumber(string.sub(p, c1 + 1, c2 - 1), 36) or now
    till = tonumber(string.sub(p, c2 + 1), 36) or 0
  end
end
if till > now then
  r[1] = 0
  r[#r + 1] = till
  return r
end
if r[1] == 1 or not counts then
  return r
end
if since + window <= now then
  count, since = 0, now
end
count = count + 1
local keep = since + window -- until when the count matters
if count >= denials then
  count, since, till = 0, now, now + box
  keep = till
end
local digits = '0123456789abcdefghijklmnopqrstuvwxyz'
local function b36(x)
  local s = ''
  repeat
    local d = x % 36
    s = string.sub(digits, d + 1, d + 1) .. s
    x = (x - d) / 36
  until x == 0
  return s
end
redis.call('HSET', KEYS[1], '!p', b36(count) .. ':' .. b36(since) .. ':' .. b36(till))
-- The key's TTL only grows: the rules' fields may need the longer one.
local ms = math.ceil((keep - now) / 1000)
if redis.call('PTTL', KEYS[1]) < ms then
  redis.call('PEXPIRE', KEYS[1], ms)
end
if till > now then
  r[#r + 1] = till
end
return r
