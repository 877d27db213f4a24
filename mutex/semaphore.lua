-- semaphore: Lua functions prepended to the semaphore scripts (semaphore_*.lua).
-- All keys of one semaphore share the name's hash tag:
-- KEYS[1] a hash: size (N), held (the sum of the holders' weights), fence
--   (the last fencing number), seq (the waiters' last sequence number), w
--   (the waiters queued), d (the records in done), due (at most the earliest
--   end among holders and waiters, 0 for none), dd (when done is swept next),
--   exp (when every key expires), and per token n:<token> (its weight),
--   f:<token> (a holder's fencing number), l:<token> (the lease in ms a
--   waiter asked for)
-- KEYS[2] holders: a sorted set of tokens scored by the end of their lease
--   (server ms)
-- KEYS[3] queue: waiters scored by their sequence number (FIFO)
-- KEYS[4] alive: waiters scored by the end of their wait lease (server ms);
--   a waiter that stops polling is passed over once it ends
-- KEYS[5] done: tokens released or cancelled, scored by the end of their
--   record (server ms): a retried release answers as its first run, and a
--   late acquire of an ended token takes nothing. A record is removed up to
--   a second after its end (sweeps are batched); it only lives longer.
-- Every key expires at exp, which is never before the latest end the sets
-- record and at most a quarter of that end's lease after it: it is moved
-- (every key touched) only when an end passes it, and a set created by a
-- call gets it then. An idle semaphore leaves nothing behind.
-- Every number is an integer below 2^53, so Lua's doubles hold it exactly:
-- size and the weights are at most 2^53 - 1 (refused above by the Go side),
-- held never exceeds size (a grant is tested as n <= size - held, which
-- cannot round), and times are server ms plus leases of at most a day.
-- The counts (held, w, d) let a call skip what is empty: a call that finds
-- nothing due, no waiter and its end within exp runs no sweep, no pump and
-- no PEXPIREAT.
local H, HOLD, QUEUE, ALIVE, DONE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- sweep bounds the expired entries one call removes, and the waiters one
-- call grants: the work of a call does not grow with the queue.
local sweep = 64
-- gap: the done set is swept at most once per gap ms (unless a sweep was
-- full).
local gap = 1000
local none = math.huge

-- text formats an integer-valued number for redis.call and replies (a Lua
-- number would be formatted with 14 digits at most).
local function text(x)
  return string.format('%d', x)
end

local function num(v)
  return tonumber(v) or 0
end

-- S: the hash's scalars, read by load and written back by save; put: the
-- per-token fields to write, drop: those to delete; fresh: the sets this
-- call created (they get exp); every: exp moved, touch every key.
local names = {'size', 'held', 'fence', 'seq', 'w', 'd', 'due', 'dd', 'exp'}
local S, S0, put, drop, fresh = {}, {}, {}, {}, {}
local every = false

-- load reads the scalars and the fields named in extra (returned in order)
-- with one HMGET.
local function load(extra)
  local fields = {unpack(names)}
  for _, f in ipairs(extra) do
    fields[#fields + 1] = f
  end
  local v = redis.call('HMGET', H, unpack(fields))
  for i, f in ipairs(names) do
    S[f] = num(v[i])
    S0[f] = S[f]
  end
  S.stored = v[1]
  S.exists = false
  for i = 1, #names do
    S.exists = S.exists or v[i] ~= false
  end
  if S.due == 0 then
    S.due = none
  end
  local out = {}
  for i = 1, #extra do
    out[i] = v[#names + i]
  end
  return out
end

local function forget(tok)
  drop[#drop + 1] = 'n:' .. tok
  drop[#drop + 1] = 'f:' .. tok
  drop[#drop + 1] = 'l:' .. tok
end

-- later notes that an end e is recorded: exp moves past it (with a quarter
-- of its lease to spare, so that the next ends do not move it again).
local function later(e)
  if e > S.exp then
    S.exp = e + math.floor((e - now) / 4)
    every = true
  end
end

local function first(key)
  local r = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return r[2] and tonumber(r[2]) or none
end

-- drop_holders gives back the permits of holders whose lease ended, at most
-- sweep of them.
local function drop_holders()
  local gone = redis.call('ZRANGEBYSCORE', HOLD, '-inf', text(now), 'LIMIT', 0, sweep)
  if #gone == 0 then
    return
  end
  local f = {}
  for i, tok in ipairs(gone) do
    f[i] = 'n:' .. tok
    forget(tok)
  end
  for _, n in ipairs(redis.call('HMGET', H, unpack(f))) do
    S.held = S.held - num(n)
  end
  redis.call('ZREM', HOLD, unpack(gone))
end

-- drop_waiters removes waiters that stopped polling, at most sweep.
local function drop_waiters()
  local dead = redis.call('ZRANGEBYSCORE', ALIVE, '-inf', text(now), 'LIMIT', 0, sweep)
  if #dead == 0 then
    return
  end
  for _, tok in ipairs(dead) do
    forget(tok)
  end
  redis.call('ZREM', QUEUE, unpack(dead))
  S.w = S.w - redis.call('ZREM', ALIVE, unpack(dead))
end

-- drop_expired runs the sweeps that are due: holders and waiters when due
-- has come (then due is set to the earliest end left), records when dd has.
local function drop_expired()
  if S.due <= now then
    if S.held > 0 then
      drop_holders()
    end
    if S.w > 0 then
      drop_waiters()
    end
    S.due = none
    if S.held > 0 then
      S.due = first(HOLD)
    end
    if S.w > 0 then
      S.due = math.min(S.due, first(ALIVE))
    end
  end
  if S.d > 0 and S.dd <= now then
    local old = redis.call('ZRANGEBYSCORE', DONE, '-inf', text(now), 'LIMIT', 0, sweep)
    if #old > 0 then
      S.d = S.d - redis.call('ZREM', DONE, unpack(old))
    end
    S.dd = now
    if #old < sweep and S.d > 0 then
      local f = first(DONE)
      S.d = f == none and 0 or S.d
      S.dd = math.max(f == none and now or f, now + gap)
    end
  end
end

-- grant makes tok a holder of n permits for lease ms from now; it returns
-- the end of the lease and the holder's fencing number, one more than the
-- last and never below the server's time in ms, so that a semaphore created
-- again after it expired goes on above the numbers it gave.
local function grant(tok, n, lease)
  S.fence = math.max(S.fence + 1, now)
  local ends = now + lease
  if S.held == 0 then
    fresh[HOLD] = true
  end
  redis.call('ZADD', HOLD, text(ends), tok)
  S.held = S.held + n
  S.due = math.min(S.due, ends)
  later(ends)
  put['n:' .. tok] = text(n)
  put['f:' .. tok] = text(S.fence)
  return ends, S.fence
end

-- record remembers tok as ended until r (server ms); the first record
-- sets when done is swept (dd), later ones wait for the sweep dd names.
local function record(tok, r)
  if S.d == 0 then
    fresh[DONE] = true
    S.dd = r
  end
  S.d = S.d + redis.call('ZADD', DONE, text(r), tok)
  later(r)
end

-- pump grants permits to the head waiters in order while they fit (strict
-- FIFO: it stops at the first that does not, so a large request is not
-- starved), and announces each grant on channel as
-- "<token>:<lease end>:<fence>", comma-separated: the waiters wake holding
-- their permits.
local function pump(channel)
  local out = {}
  for _ = 1, sweep do
    if S.w == 0 or S.held >= S.size then
      break
    end
    local head = redis.call('ZRANGE', QUEUE, 0, 0)[1]
    if not head then
      break
    end
    local v = redis.call('HMGET', H, 'n:' .. head, 'l:' .. head)
    local n = num(v[1])
    if n > S.size - S.held then
      break
    end
    redis.call('ZREM', QUEUE, head)
    S.w = S.w - redis.call('ZREM', ALIVE, head)
    drop[#drop + 1] = 'l:' .. head
    local ends, fence = grant(head, n, num(v[2]))
    out[#out + 1] = head .. ':' .. text(ends) .. ':' .. text(fence)
  end
  if #out > 0 then
    redis.call('PUBLISH', channel, table.concat(out, ','))
  end
end

-- expire sets exp on every key that exists (every), or on the sets this
-- call created.
local function expire()
  local live = {[HOLD] = S.held > 0, [QUEUE] = S.w > 0, [ALIVE] = S.w > 0, [DONE] = S.d > 0}
  if every then
    redis.call('PEXPIREAT', H, text(S.exp))
  end
  for _, k in ipairs({HOLD, QUEUE, ALIVE, DONE}) do
    if live[k] and (every or fresh[k]) then
      redis.call('PEXPIREAT', k, text(S.exp))
    end
  end
end

-- save writes back what the call changed (one HDEL, one HSET) and the
-- keys' expiry, or deletes the hash once nothing is held, queued or
-- recorded.
local function save()
  if S.held <= 0 and S.w <= 0 and S.d <= 0 then
    if S.exists then
      redis.call('DEL', H)
    end
    return
  end
  if #drop > 0 then
    redis.call('HDEL', H, unpack(drop))
  end
  if S.due == none then
    S.due = 0
  end
  local args = {}
  for _, f in ipairs(names) do
    if S[f] ~= S0[f] then
      args[#args + 1] = f
      args[#args + 1] = text(S[f])
    end
  end
  for f, v in pairs(put) do
    args[#args + 1] = f
    args[#args + 1] = v
  end
  if #args > 0 then
    redis.call('HSET', H, unpack(args))
  end
  every = every or not S.exists
  expire()
end
