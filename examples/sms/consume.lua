-- consume: use a code once: take its HMAC away if it is still the given one.
-- KEYS[1] the code's hash
-- ARGV[1] the HMAC that matched, ARGV[2] this use's nonce,
-- ARGV[3] how long (ms) the record of the use is kept
-- Returns 1 for the one caller that used the code, 0 for any other. The
-- hash keeps only the user's nonce (u), briefly, so that the same call run
-- again (go-redis retried it after a lost reply) still answers 1, not "no
-- code", and a used code can never match again.
if redis.call('HGET', KEYS[1], 'm') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'u', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
if redis.call('HGET', KEYS[1], 'u') == ARGV[2] then
  return 1
end
return 0
