-- semaphore: Lua functions prepended to the semaphore scripts (semaphore_*.lua).
-- All keys of one semaphore share the name's hash tag:
-- KEYS[1] a hash: size (N), held (the sum of the holders' weights), seq (the
--   waiters' last sequence number), fence (the last fencing number), and per
--   token n:<token> (its weight), f:<token> (a holder's fencing number),
--   l:<token> (the lease in ms a waiter asked for)
-- KEYS[2] holders: a sorted set of tokens scored by the end of their lease
--   (server ms)
-- KEYS[3] queue: waiters scored by their sequence number (FIFO)
-- KEYS[4] alive: waiters scored by the end of their wait lease (server ms);
--   a waiter that stops polling is passed over once it ends
-- KEYS[5] done: tokens released or cancelled, scored by the end of their
--   record (server ms): a retried release answers as its first run, and a
--   late acquire of an ended token takes nothing
-- Every key expires at the latest end among the three sorted sets' scores
-- (touch), so an idle semaphore leaves nothing behind.
local H, HOLD, QUEUE, ALIVE, DONE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- sweep bounds the expired entries one call removes, and the waiters one
-- call grants: the work of a call does not grow with the queue.
local sweep = 64

-- text formats an integer-valued number for redis.call and replies (a Lua
-- number would be formatted with 14 digits at most).
local function text(x)
  return string.format('%d', x)
end

local function num(v)
  return tonumber(v) or 0
end

local function forget(tok)
  redis.call('HDEL', H, 'n:' .. tok, 'f:' .. tok, 'l:' .. tok)
end

-- drop_expired gives back the permits of holders whose lease ended and
-- removes waiters that stopped polling, at most sweep of each.
local function drop_expired()
  local gone = redis.call('ZRANGEBYSCORE', HOLD, '-inf', text(now), 'LIMIT', 0, sweep)
  if #gone > 0 then
    local freed = 0
    for _, tok in ipairs(gone) do
      freed = freed + num(redis.call('HGET', H, 'n:' .. tok))
      forget(tok)
    end
    redis.call('ZREM', HOLD, unpack(gone))
    redis.call('HINCRBY', H, 'held', -freed)
  end
  local dead = redis.call('ZRANGEBYSCORE', ALIVE, '-inf', text(now), 'LIMIT', 0, sweep)
  if #dead > 0 then
    for _, tok in ipairs(dead) do
      forget(tok)
    end
    redis.call('ZREM', QUEUE, unpack(dead))
    redis.call('ZREM', ALIVE, unpack(dead))
  end
  local old = redis.call('ZRANGEBYSCORE', DONE, '-inf', text(now), 'LIMIT', 0, sweep)
  if #old > 0 then
    redis.call('ZREM', DONE, unpack(old))
  end
end

-- grant makes tok a holder of n permits for lease ms from now; it returns
-- the end of the lease and the holder's fencing number, one more than the
-- last and never below the server's time in ms, so that a semaphore created
-- again after it expired goes on above the numbers it gave.
local function grant(tok, n, lease)
  local fence = math.max(num(redis.call('HGET', H, 'fence')) + 1, now)
  local ends = now + lease
  redis.call('ZADD', HOLD, text(ends), tok)
  redis.call('HSET', H, 'fence', text(fence), 'n:' .. tok, text(n), 'f:' .. tok, text(fence))
  redis.call('HINCRBY', H, 'held', n)
  return ends, fence
end

-- pump grants permits to the head waiters in order while they fit (strict
-- FIFO: it stops at the first that does not, so a large request is not
-- starved), and announces each grant on channel as
-- "<token>:<lease end>:<fence>", comma-separated: the waiters wake holding
-- their permits.
local function pump(channel)
  local size = num(redis.call('HGET', H, 'size'))
  local held = num(redis.call('HGET', H, 'held'))
  local out = {}
  for _ = 1, sweep do
    local head = redis.call('ZRANGE', QUEUE, 0, 0)[1]
    if not head then
      break
    end
    local n = num(redis.call('HGET', H, 'n:' .. head))
    if held + n > size then
      break
    end
    local lease = num(redis.call('HGET', H, 'l:' .. head))
    redis.call('ZREM', QUEUE, head)
    redis.call('ZREM', ALIVE, head)
    redis.call('HDEL', H, 'l:' .. head)
    local ends, fence = grant(head, n, lease)
    held = held + n
    out[#out + 1] = head .. ':' .. text(ends) .. ':' .. text(fence)
  end
  if #out > 0 then
    redis.call('PUBLISH', channel, table.concat(out, ','))
  end
end

local function top(key)
  local r = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  return num(r[2])
end

-- touch sets every key to expire at the latest end it records, or deletes
-- them all when nothing is held, queued or recorded.
local function touch()
  local last = math.max(top(HOLD), top(ALIVE), top(DONE))
  if last <= now then
    redis.call('DEL', H, HOLD, QUEUE, ALIVE, DONE)
    return
  end
  for _, k in ipairs(KEYS) do
    redis.call('PEXPIREAT', k, text(last))
  end
end
