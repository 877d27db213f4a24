-- semaphore: Lua functions prepended to the semaphore scripts (semaphore_*.lua).
-- All keys of one semaphore share the name's hash tag:
-- KEYS[1] a hash: held (the sum of the holders' weights), w (the waiters
--   queued), d (the records in done), m: the other scalars in one value
--   "<size>:<fence>:<seq>:<due>:<dd>:<exp>" (size N; fence the last fencing
--   number; seq the waiters' last sequence number; due at most the earliest
--   end among holders and waiters, 0 for none; dd when done is swept next;
--   exp when every key expires), and one field per token (the token itself,
--   32 hex digits, never a scalar's name), its state in one value:
--   "h<n>:<fence>:<lease end>" a holder of n permits, "w<n>:<lease>:<seq>" a
--   waiter for n permits (lease: the ms it asked for; seq: its place),
--   "d" a token released or cancelled (recorded in done). One HMGET of five
--   fields reads the scalars and the caller's token; no call looks a token
--   up in a set. (Redis spends about half a microsecond per field a script
--   reads or writes, and as much to format a Lua number given to
--   redis.call: the scripts pass text, and read few fields.)
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
-- Numbers go to redis.call as text (text: string.format('%d'), exact, and
-- cheaper than Redis's formatting of a Lua number) and to replies as
-- numbers (Redis sends them as integers: exact); concatenation would keep
-- 14 digits only.
-- The counts (held, w, d) let a call skip what is empty: a call that finds
-- nothing due, no waiter and its end within exp runs no sweep, no pump and
-- no PEXPIREAT. The common paths are straight-line: the scripts' cost is
-- mostly Lua's own work (tables, strings, closures), so they make few.
local H, HOLD, QUEUE, ALIVE, DONE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
-- sweep bounds the expired entries one call removes, and the waiters one
-- call grants: the work of a call does not grow with the queue.
local sweep = 64
-- gap: the done set is swept at most once per gap ms (unless a sweep was
-- full).
local gap = 1000
local none = math.huge

-- text formats an integer-valued number for redis.call.
local function text(x)
  return string.format('%d', x)
end

-- S: the hash's scalars (S0 as stored), read by load and written back by
-- save; put: the token fields to write (false: delete); fresh: the sets
-- this call created (they get exp); every: exp moved, touch every key;
-- held: whether the holders set has members.
local S, S0, put, fresh = {}, {}, {}, {}
local every, held = false, false

-- meta is the packed field m of S's values.
local function meta()
  return string.format('%d:%d:%d:%d:%d:%d', S.size, S.fence, S.seq, S.due == none and 0 or S.due, S.dd, S.exp)
end

-- load reads the scalars and tok's field with one HMGET; it returns the
-- field (false when tok is unknown). S.sized: the hash keeps a size (a
-- cancel's record alone does not); S.exists: it keeps any scalar.
local function load(tok)
  local v = redis.call('HMGET', H, 'held', 'w', 'd', 'm', tok)
  S.exists = v[1] or v[2] or v[3] or v[4]
  S.held, S.w, S.d = tonumber(v[1]) or 0, tonumber(v[2]) or 0, tonumber(v[3]) or 0
  S0.held, S0.w, S0.d, S0.m = S.held, S.w, S.d, v[4]
  local size, fence, seq, due, dd, exp = string.match(v[4] or '', '^(%d+):(%d+):(%d+):(%d+):(%d+):(%d+)$')
  S.size, S.fence, S.seq = tonumber(size) or 0, tonumber(fence) or 0, tonumber(seq) or 0
  S.due, S.dd, S.exp = tonumber(due) or 0, tonumber(dd) or 0, tonumber(exp) or 0
  S.sized = S.size > 0
  if S.due == 0 then
    S.due = none
  end
  held = S.held > 0
  return v[5]
end

-- state is tok's field now: as loaded (v), or as this call changed it
-- (nil when a sweep dropped it).
local function state(tok, v)
  local p = put[tok]
  if p == nil then
    return v or nil
  end
  return p or nil
end

-- holder reads a holder's field: its weight, fence and lease end (nil
-- for another state).
local function holder(v)
  local n, f, e = string.match(v or '', '^h(%d+):(%d+):(%d+)$')
  return tonumber(n), tonumber(f), tonumber(e)
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
  for i, v in ipairs(redis.call('HMGET', H, unpack(gone))) do
    S.held = S.held - (holder(v) or 0)
    put[gone[i]] = false
  end
  redis.call('ZREM', HOLD, unpack(gone))
  held = S.held > 0
end

-- drop_waiters removes waiters that stopped polling, at most sweep.
local function drop_waiters()
  local dead = redis.call('ZRANGEBYSCORE', ALIVE, '-inf', text(now), 'LIMIT', 0, sweep)
  if #dead == 0 then
    return
  end
  for _, tok in ipairs(dead) do
    put[tok] = false
  end
  redis.call('ZREM', QUEUE, unpack(dead))
  S.w = S.w - redis.call('ZREM', ALIVE, unpack(dead))
end

-- drop_records removes records that ended, at most sweep, once per gap.
local function drop_records()
  local old = redis.call('ZRANGEBYSCORE', DONE, '-inf', text(now), 'LIMIT', 0, sweep)
  if #old > 0 then
    S.d = S.d - redis.call('ZREM', DONE, unpack(old))
    for _, tok in ipairs(old) do
      put[tok] = false
    end
  end
  S.dd = now
  if #old < sweep and S.d > 0 then
    local f = first(DONE)
    S.d = f == none and 0 or S.d
    S.dd = math.max(f == none and now or f, now + gap)
  end
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
    drop_records()
  end
end

-- grant makes tok a holder of n permits for lease ms from now; it returns
-- the end of the lease and the holder's fencing number, one more than the
-- last and never below the server's time in ms, so that a semaphore created
-- again after it expired goes on above the numbers it gave.
local function grant(tok, n, lease)
  S.fence = math.max(S.fence + 1, now)
  local ends = now + lease
  if not held then
    fresh[HOLD], held = true, true
  end
  redis.call('ZADD', HOLD, text(ends), tok)
  S.held = S.held + n
  S.due = math.min(S.due, ends)
  later(ends)
  put[tok] = string.format('h%d:%d:%d', n, S.fence, ends)
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
  put[tok] = 'd'
  later(r)
end

-- pump grants permits to the head waiters in order while they fit (strict
-- FIFO: it stops at the first that does not, and puts it back at its
-- place, so a large request is not starved), and announces each grant on
-- channel as "<token>:<lease end>:<fence>", comma-separated: the waiters
-- wake holding their permits.
local function pump(channel)
  local out
  for _ = 1, sweep do
    if S.w == 0 or S.held >= S.size then
      break
    end
    local head = redis.call('ZPOPMIN', QUEUE)
    local tok = head[1]
    if not tok then
      break
    end
    local n, lease = string.match(redis.call('HGET', H, tok) or '', '^w(%d+):(%d+):')
    n = tonumber(n) or 0
    if n > S.size - S.held then
      fresh[QUEUE] = fresh[QUEUE] or S.w == 1 -- popping the last one deleted it
      redis.call('ZADD', QUEUE, head[2], tok)
      break
    end
    S.w = S.w - redis.call('ZREM', ALIVE, tok)
    if n > 0 then
      local ends, fence = grant(tok, n, tonumber(lease))
      out = out or {}
      out[#out + 1] = string.format('%s:%d:%d', tok, ends, fence)
    end
  end
  if out then
    redis.call('PUBLISH', channel, table.concat(out, ','))
  end
end

-- expire sets exp on every key that exists (every), or on the sets this
-- call created.
local function expire()
  if every then
    redis.call('PEXPIREAT', H, text(S.exp))
  end
  local live = {[HOLD] = S.held > 0, [QUEUE] = S.w > 0, [ALIVE] = S.w > 0, [DONE] = S.d > 0}
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
  local args, gone = {}, {}
  for f, v in pairs(put) do
    if v then
      args[#args + 1] = f
      args[#args + 1] = v
    else
      gone[#gone + 1] = f
    end
  end
  if #gone > 0 then
    redis.call('HDEL', H, unpack(gone))
  end
  for _, f in ipairs({'held', 'w', 'd'}) do
    if S[f] ~= S0[f] then
      args[#args + 1] = f
      args[#args + 1] = text(S[f])
    end
  end
  local m = meta()
  if m ~= S0.m then
    args[#args + 1] = 'm'
    args[#args + 1] = m
  end
  if #args > 0 then
    redis.call('HSET', H, unpack(args))
  end
  every = every or not S.exists
  if every or next(fresh) then
    expire()
  end
end
