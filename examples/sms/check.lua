-- check: decide one verification of a code in one step: whether a code is
-- live, whether the guess is right, and what that does to the code. A right
-- guess is not an attempt: it uses the code. A wrong one is: the code is
-- spent at the max-th, so at most max wrong guesses are ever compared.
-- KEYS[1] the code's hash: m the code's HMAC (64 hex digits), a the wrong
--   guesses compared so far, c:<nonce> the reply of each comparison made
-- ARGV[1] the guess's HMAC (64 hex digits), ARGV[2] max wrong guesses,
-- ARGV[3] this verification's nonce, ARGV[4] how long (ms) the hash keeps
-- its replies once the code is used or spent, ARGV[5] 1 to compare, 0 to
-- look only (the number is locked out of verification)
-- Returns 0 when there is no live code (never sent, expired, used, spent),
-- 1 right (the code is used, by this call), 2 wrong (counted), 3 locked (a
-- live code, not compared), 4 wrong and the last attempt (counted, and the
-- code is spent by this call).
-- Run again with one nonce (go-redis retried it after a lost reply), it
-- returns what the first run returned and changes nothing: every comparison
-- leaves its reply under its nonce, kept as long as the code lives and for
-- ARGV[4] ms after it is used or spent.
local record = 'c:' .. ARGV[3]
local first = redis.call('HGET', KEYS[1], record)
if first then
  return tonumber(first)
end
local mac = redis.call('HGET', KEYS[1], 'm')
if not mac then
  return 0
end
if ARGV[5] ~= '1' then
  return 3
end
-- Timing: both sides are HMAC-SHA256 under the service's secret, 64 hex
-- digits each, so the length never shows. Redis interns Lua strings, so ==
-- compares pointers; the work that depends on the bytes (hashing and
-- matching the strings when they are made) depends only on the two MACs, and
-- how much of the guess's MAC matches the code's tells nothing about the
-- code to someone who cannot compute MACs without the secret.
local reply = 2
if mac == ARGV[1] then
  reply = 1
end
if reply == 1 or redis.call('HINCRBY', KEYS[1], 'a', 1) >= tonumber(ARGV[2]) then
  if reply == 2 then
    reply = 4
  end
  redis.call('HDEL', KEYS[1], 'm', 'a')
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
redis.call('HSET', KEYS[1], record, reply)
return reply
