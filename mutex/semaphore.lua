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
local call, format, match = redis.call, string.format, string.match
local t = call('TIME')
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
  return format('%d', x)
end

-- S: the hash's scalars, read by load and written back by save (S0: held,
-- w, d and m as stored); put: the token fields to write (false: delete);
-- fresh: the sets this call created (they get exp); every: exp moved,
-- touch every key; held: whether the holders set has members. The tables
-- are made with their fields: no call grows them.
local S = {held = 0, w = 0, d = 0, size = 0, fence = 0, seq = 0, due = 0, dd = 0, exp = 0, exists = false, sized = false}
local S0 = {held = 0, w = 0, d = 0, m = false}
local fresh = {hold = false, queue = false, alive = false, done = false}
local put = {}
local every, held = false, false

-- load reads the scalars and tok's field with one HMGET; it returns the
-- field (false when tok is unknown). S.sized: the hash keeps a size (a
-- cancel's record alone does not); S.exists: it keeps any scalar.
local function load(tok)
  local v = call('HMGET', H, 'held', 'w', 'd', 'm', tok)
  S.exists = v[1] or v[2] or v[3] or v[4]
  S.held, S.w, S.d = tonumber(v[1]) or 0, tonumber(v[2]) or 0, tonumber(v[3]) or 0
  S0.held, S0.w, S0.d, S0.m = S.held, S.w, S.d, v[4]
  if v[4] then
    local size, fence, seq, due, dd, exp = match(v[4], '^(%d+):(%d+):(%d+):(%d+):(%d+):(%d+)$')
    S.size, S.fence, S.seq = tonumber(size), tonumber(fence), tonumber(seq)
    S.due, S.dd, S.exp = tonumber(due), tonumber(dd), tonumber(exp)
  end
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
  local n, f, e = match(v or '', '^h(%d+):(%d+):(%d+)$')
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
  local r = call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return r[2] and tonumber(r[2]) or none
end

-- drop_holders gives back the permits of holders whose lease ended, at most
-- sweep of them.
local function drop_holders()
  local gone = call('ZRANGEBYSCORE', HOLD, '-inf', text(now), 'LIMIT', 0, sweep)
  if #gone == 0 then
    return
  end
  for i, v in ipairs(call('HMGET', H, unpack(gone))) do
    S.held = S.held - (holder(v) or 0)
    put[gone[i]] = false
  end
  call('ZREM', HOLD, unpack(gone))
  held = S.held > 0
end

-- drop_waiters removes waiters that stopped polling, at most sweep.
local function drop_waiters()
  local dead = call('ZRANGEBYSCORE', ALIVE, '-inf', text(now), 'LIMIT', 0, sweep)
  if #dead == 0 then
    return
  end
  for _, tok in ipairs(dead) do
    put[tok] = false
  end
  call('ZREM', QUEUE, unpack(dead))
  S.w = S.w - call('ZREM', ALIVE, unpack(dead))
end

-- drop_records removes records that ended, at most sweep, once per gap.
local function drop_records()
  local old = call('ZRANGEBYSCORE', DONE, '-inf', text(now), 'LIMIT', 0, sweep)
  if #old > 0 then
    S.d = S.d - call('ZREM', DONE, unpack(old))
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
    fresh.hold, held = true, true
  end
  call('ZADD', HOLD, text(ends), tok)
  S.held = S.held + n
  if ends < S.due then
    S.due = ends
  end
  later(ends)
  put[tok] = format('h%d:%d:%d', n, S.fence, ends)
  return ends, S.fence
end

-- record remembers tok as ended until r (server ms); the first record
-- sets when done is swept (dd), later ones wait for the sweep dd names.
local function record(tok, r)
  if S.d == 0 then
    fresh.done = true
    S.dd = r
  end
  S.d = S.d + call('ZADD', DONE, text(r), tok)
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
    local head = call('ZPOPMIN', QUEUE)
    local tok = head[1]
    if not tok then
      break
    end
    local n, lease = match(call('HGET', H, tok) or '', '^w(%d+):(%d+):')
    n = tonumber(n) or 0
    if n > S.size - S.held then
      fresh.queue = fresh.queue or S.w == 1 -- popping the last one deleted it
      call('ZADD', QUEUE, head[2], tok)
      break
    end
    S.w = S.w - call('ZREM', ALIVE, tok)
    if n > 0 then
      local ends, fence = grant(tok, n, tonumber(lease))
      out = out or {}
      out[#out + 1] = format('%s:%d:%d', tok, ends, fence)
    end
  end
  if out then
    call('PUBLISH', channel, table.concat(out, ','))
  end
end

-- expire sets exp on every key that exists (every), or on the sets this
-- call created.
local function expire()
  local e = text(S.exp)
  if every then
    call('PEXPIREAT', H, e)
  end
  if S.held > 0 and (every or fresh.hold) then
    call('PEXPIREAT', HOLD, e)
  end
  if S.w > 0 and (every or fresh.queue) then
    call('PEXPIREAT', QUEUE, e)
  end
  if S.w > 0 and (every or fresh.alive) then
    call('PEXPIREAT', ALIVE, e)
  end
  if S.d > 0 and (every or fresh.done) then
    call('PEXPIREAT', DONE, e)
  end
end

-- save writes back what the call changed (one HDEL, one HSET) and the
-- keys' expiry, or deletes the hash once nothing is held, queued or
-- recorded.
local function save()
  if S.held <= 0 and S.w <= 0 and S.d <= 0 then
    if S.exists then
      call('DEL', H)
    end
    return
  end
  local args, gone = {}, nil
  for f, v in pairs(put) do
    if v then
      args[#args + 1] = f
      args[#args + 1] = v
    else
      gone = gone or {}
      gone[#gone + 1] = f
    end
  end
  if gone then
    call('HDEL', H, unpack(gone))
  end
  if S.held ~= S0.held then
    args[#args + 1] = 'held'
    args[#args + 1] = text(S.held)
  end
  if S.w ~= S0.w then
    args[#args + 1] = 'w'
    args[#args + 1] = text(S.w)
  end
  if S.d ~= S0.d then
    args[#args + 1] = 'd'
    args[#args + 1] = text(S.d)
  end
  local m = format('%d:%d:%d:%d:%d:%d', S.size, S.fence, S.seq, S.due == none and 0 or S.due, S.dd, S.exp)
  if m ~= S0.m then
    args[#args + 1] = 'm'
    args[#args + 1] = m
  end
  if #args > 0 then
    call('HSET', H, unpack(args))
  end
  every = every or not S.exists
  if every or fresh.hold or fresh.queue or fresh.alive or fresh.done then
    expire()
  end
end
