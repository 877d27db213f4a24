-- reset: forget a key's state; run only while the lock is held.
-- KEYS[1] the state hash
redis.call('DEL', KEYS[1])
return 1
