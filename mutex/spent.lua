-- spent: delete the lock if one of the given spent tokens holds it (a token
-- whose handle released the lock, and whose abandoned attempt ran late and
-- took it again: spent.go). Nobody holds such a lock, so no release record
-- is written; a waiter that marked the lock hears of it, as of a release.
-- KEYS[1] the lock key
-- ARGV the spent tokens
-- Returns the index in ARGV of the token whose lock it deleted; 0 when the
-- lock is free or held by another token. Safe to run twice: the second run
-- finds the lock gone (or another's) and returns 0.
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
local token = value_token(v)
for i = 1, #ARGV do
  if ARGV[i] == token then
    redis.call('DEL', KEYS[1])
    if value_marked(v) then
      redis.call('PUBLISH', string.sub(KEYS[1], 1, -5) .. 'released', '1')
    end
    return i
  end
end
return 0
