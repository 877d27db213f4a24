-- attempt: count one verification attempt of a code, atomically, so that at
-- most max attempts are ever checked however many run at once.
-- KEYS[1] the code's hash (field m: the code's HMAC, a: attempts so far,
-- n: the nonce of the last attempt counted)
-- ARGV[1] max attempts, ARGV[2] this attempt's nonce
-- Returns {0} when there is no code (never sent, expired, used, invalidated),
-- {2} when this attempt is one too many (the code is deleted),
-- {1, mac} when the caller may compare its code with mac.
-- Run twice with one nonce (go-redis retried it after a lost reply), it
-- counts the attempt once.
local mac = redis.call('HGET', KEYS[1], 'm')
if not mac then
  return {0}
end
if redis.call('HGET', KEYS[1], 'n') == ARGV[2] then
  return {1, mac}
end
if redis.call('HINCRBY', KEYS[1], 'a', 1) > tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return {2}
end
redis.call('HSET', KEYS[1], 'n', ARGV[2])
return {1, mac}
