-- consume: use a code once: delete it if it still holds the given HMAC.
-- KEYS[1] the code's hash
-- ARGV[1] the HMAC that matched
-- Returns 1 for the one caller that used the code, 0 for any other.
if redis.call('HGET', KEYS[1], 'm') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
