-- conversion: decide one send to a destination prefix by what became of the
-- prefix's last sends, and record it if admitted. All in the server's clock.
-- KEYS[1] the prefix's sends: a sorted set, member a send's id, score its
--   time (µs since the epoch): the window; at most ARGV[2] + 1 members (it
--   is cut to the last ARGV[2] before each decision, not when a send is
--   added, so that a send taken back leaves the window as it was)
-- KEYS[2] their outcomes: a hash, id -> v (verified) or u (undelivered); a
--   send with neither is outstanding while its code lives, then expired
-- KEYS[3] the prefix's pause: a hash, until (µs), by (the id of the send
--   that paused it), prefix, verified, judged; it expires when the pause ends
-- ARGV[1] this send's id, ARGV[2] n: how many sends are judged, ARGV[3] how
-- many of them must be verified, ARGV[4] the code TTL (µs), ARGV[5] the
-- pause (µs), ARGV[6] how long a send is kept (µs), ARGV[7] the prefix as
-- logged
-- Returns {verdict, µs, verified, judged}: {1, 0} admitted, the send
-- recorded; {2, left} paused; {3, left, verified, judged} paused by this
-- send, with the figures it was paused for: the last n sends cannot reach
-- ARGV[3] verified, even if every outstanding code is verified, and the
-- window is emptied so that the prefix starts afresh when the pause ends;
-- {4, wait} held: the last n sends have fewer than ARGV[3] verified, but
-- enough outstanding codes to reach it; wait is until the first of those
-- expires.
-- Run again with one id (go-redis retried it after a lost reply), it
-- answers as the first run did: a recorded send is admitted, the send that
-- paused the prefix is answered 3.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local id = ARGV[1]
if redis.call('ZSCORE', KEYS[1], id) then
  return {1, 0}
end
local pause = redis.call('HMGET', KEYS[3], 'until', 'by', 'verified', 'judged')
local ends = tonumber(pause[1])
if ends and ends > now then
  if pause[2] == id then
    return {3, ends - now, tonumber(pause[3]), tonumber(pause[4])}
  end
  return {2, ends - now}
end
local n, need, ttl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local keep = tonumber(ARGV[6])
-- Forget the sends older than keep, and all but the last n.
local sends = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local count = #sends / 2
local first = math.max(1, count - n + 1)
while first <= count and tonumber(sends[2 * first]) <= now - keep do
  first = first + 1
end
local function forget(from, to)
  if to < from then
    return
  end
  local ids = {}
  for i = from, to do
    ids[#ids + 1] = sends[2 * i - 1]
  end
  redis.call('ZREM', KEYS[1], unpack(ids))
  redis.call('HDEL', KEYS[2], unpack(ids))
end
forget(1, first - 1)
if count - first + 1 >= n then
  local ids = {}
  for i = first, count do
    ids[#ids + 1] = sends[2 * i - 1]
  end
  local outcomes = redis.call('HMGET', KEYS[2], unpack(ids))
  local verified, outstanding, next = 0, 0, nil
  for i = 1, #ids do
    local expires = tonumber(sends[2 * (first + i - 1)]) + ttl
    if outcomes[i] == 'v' then
      verified = verified + 1
    elseif not outcomes[i] and expires > now then
      outstanding = outstanding + 1
      if not next or expires < next then
        next = expires
      end
    end
  end
  if verified + outstanding < need then
    local length = tonumber(ARGV[5])
    redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
    redis.call('HSET', KEYS[3], 'until', now + length, 'by', id, 'prefix', ARGV[7],
      'verified', verified, 'judged', n - outstanding)
    redis.call('PEXPIRE', KEYS[3], math.ceil(length / 1000))
    return {3, length, verified, n - outstanding}
  end
  if verified < need then
    return {4, next - now}
  end
end
-- Each send a time of its own, after the last one's, so that the order of
-- the set is the order of the sends even within one µs.
local at = now
if count > 0 then
  at = math.max(now, tonumber(sends[2 * count]) + 1)
end
redis.call('ZADD', KEYS[1], at, id)
local ms = math.ceil(keep / 1000)
redis.call('PEXPIRE', KEYS[1], ms)
redis.call('PEXPIRE', KEYS[2], ms)
return {1, 0}
