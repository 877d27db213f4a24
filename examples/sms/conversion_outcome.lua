-- conversion_outcome: record what became of the last send to one number in its
-- prefix's window (see conversion.lua): verified, or undelivered.
-- KEYS[1] the prefix's sends (a sorted set of ids by time), KEYS[2] their
-- outcomes (a hash, id -> v or u)
-- ARGV[1] the number's tag: the ids of the sends to it start with it,
-- ARGV[2] v (its code was verified) or u (the provider reports it
-- undelivered), ARGV[3] how long the outcomes are kept (ms)
-- Returns 1 when the send has the outcome, 0 when the window holds no send
-- to the number (it left the window, or the prefix was paused since) or
-- when u is reported for a verified send (a code that was used reached
-- someone). Run again, it changes nothing more and answers the same.
local sends = redis.call('ZRANGE', KEYS[1], 0, -1)
local tag = ARGV[1]
for i = #sends, 1, -1 do
  local id = sends[i]
  if string.sub(id, 1, #tag) == tag then
    local was = redis.call('HGET', KEYS[2], id)
    if was == 'v' and ARGV[2] ~= 'v' then
      return 0
    end
    if was ~= ARGV[2] then
      redis.call('HSET', KEYS[2], id, ARGV[2])
      redis.call('PEXPIRE', KEYS[2], ARGV[3])
    end
    return 1
  end
end
return 0
