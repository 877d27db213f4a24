-- semaphore_lib: the functions of the semaphore scripts' general path
-- (after semaphore.lua and a script's fast path; see semaphore_scripts.go).
-- put: the token fields to write (false: delete); zs: the ZADD of the ends
-- set that save sends (one for the call); fresh_ends, fresh_queue: the
-- sets this call created (they get exp); every: exp moved, touch every
-- key.
local put = {}
local zs = {ENDS}
local fresh_ends, fresh_queue, every = false, false, false

-- holder reads a holder's field: its weight, fence and lease end (nil
-- for another state).
local function holder(f)
  local n, fe, e = string.match(f or '', '^h(%d+):(%d+):(%d+)$')
  return tonumber(n), tonumber(fe), tonumber(e)
end

-- later notes that an end e is recorded: exp moves past it (with a quarter
-- of its lease to spare, so that the next ends do not move it again).
local function later(e)
  if e > exp then
    exp = e + floor((e - now) / 4)
    every = true
  end
end

-- ends sets tok's score in the ends set to e (sent by save), and notes
-- that the set is created when it has no member yet (fresh: tok is new to
-- it, and the counts say it is empty).
local function ends(tok, e, fresh)
  if fresh and held == 0 and w == 0 and d == 0 then
    fresh_ends = true
  end
  zs[#zs + 1] = e
  zs[#zs + 1] = tok
end

-- grant makes tok a holder of n permits for lease ms from now (fresh: tok
-- is not in the ends set yet); it returns the end of the lease and the
-- holder's fencing number, one more than the last and never below the
-- server's time in ms, so that a semaphore created again after it expired
-- goes on above the numbers it gave.
local function grant(tok, n, lease, fresh)
  fence = fence + 1
  if fence < now then
    fence = now
  end
  local e = now + lease
  ends(tok, e, fresh)
  held = held + n
  if e < due then
    due = e
  end
  later(e)
  put[tok] = format('h%d:%d:%d', n, fence, e)
  return e, fence
end

-- record remembers tok as ended until r (server ms) (fresh: tok is not in
-- the ends set); the first record sets when records are swept (dd), later
-- ones wait for the sweep dd names.
local function record(tok, r, fresh)
  ends(tok, rec0 + r, fresh)
  if d == 0 then
    dd = r
  end
  d = d + 1
  put[tok] = 'd'
  later(r)
end

-- first is the lowest score of a sorted set (none when it is empty).
local function first(key)
  local r = call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return r[2] and tonumber(r[2]) or none
end

-- drop_expired runs the sweeps that are due, before the call writes
-- anything: holders whose lease ended (their permits come back) and
-- waiters that stopped polling when due has come (then due is set to the
-- earliest end left), records when dd has; at most sweep of each.
local function drop_expired()
  if due <= now then
    local gone = call('ZRANGEBYSCORE', ENDS, '-inf', now, 'LIMIT', 0, sweep)
    if #gone > 0 then
      local dead
      for i, f in ipairs(call('HMGET', H, unpack(gone))) do
        local k = f and string.byte(f)
        if k == 104 then -- h
          held = held - (holder(f) or 0)
        elseif k == 119 then -- w
          dead = dead or {QUEUE}
          dead[#dead + 1] = gone[i]
        end
        put[gone[i]] = false
      end
      call('ZREM', ENDS, unpack(gone))
      if dead then
        w = w - call('ZREM', unpack(dead))
      end
    end
    due = none
    if held > 0 or w > 0 then
      local f = first(ENDS)
      if f < rec0 then
        due = f
      end
    end
  end
  if d > 0 and dd <= now then
    local old = call('ZRANGEBYSCORE', ENDS, rec0, rec0 + now, 'LIMIT', 0, sweep)
    if #old > 0 then
      d = d - call('ZREM', ENDS, unpack(old))
      for _, tok in ipairs(old) do
        put[tok] = false
      end
    end
    dd = now
    if #old < sweep and d > 0 then
      local r = call('ZRANGEBYSCORE', ENDS, rec0, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
      local f = r[2] and tonumber(r[2]) - rec0 or none
      d = f == none and 0 or d
      dd = math.max(f == none and now or f, now + gap)
    end
  end
end

-- pump grants permits to the head waiters in order while they fit (strict
-- FIFO: it stops at the first that does not, and puts it back at its
-- place, so a large request is not starved), and announces each grant on
-- channel as "<token>:<lease end>:<fence>", comma-separated: the waiters
-- wake holding their permits. The caller calls it only when someone waits
-- and a permit is free.
local function pump(channel)
  local out
  for _ = 1, sweep do
    if w == 0 or held >= size then
      break
    end
    local head = call('ZPOPMIN', QUEUE)
    local tok = head[1]
    if not tok then
      break
    end
    local n, lease = string.match(call('HGET', H, tok) or '', '^w(%d+):(%d+):')
    n = tonumber(n) or 0
    if n > size - held then
      fresh_queue = fresh_queue or w == 1 -- popping the last one deleted it
      call('ZADD', QUEUE, head[2], tok)
      break
    end
    if n > 0 then
      local e, fe = grant(tok, n, tonumber(lease), false)
      out = out or {}
      out[#out + 1] = format('%s:%d:%d', tok, e, fe)
    else -- no waiter's field: not a waiter any more
      call('ZREM', ENDS, tok)
      put[tok] = false
    end
    w = w - 1
  end
  if out then
    call('PUBLISH', channel, table.concat(out, ','))
  end
end

-- save writes back what the call changed (one ZADD, one HDEL, one HSET)
-- and the keys' expiry: every key that exists when exp moved (every), else
-- the sets this call created; or it deletes the hash once nothing is held,
-- queued or recorded.
local function save()
  if #zs > 1 then
    call('ZADD', unpack(zs))
  end
  if held <= 0 and w <= 0 and d <= 0 then
    if exists then
      call('DEL', H)
    end
    return
  end
  local args, gone = {H}, nil
  for f, x in pairs(put) do
    if x then
      args[#args + 1] = f
      args[#args + 1] = x
    else
      gone = gone or {H}
      gone[#gone + 1] = f
    end
  end
  if gone then
    call('HDEL', unpack(gone))
  end
  local m = format(M, held, w, d, size, fence, seq, due == none and 0 or due, dd, exp)
  if m ~= m0 then
    args[#args + 1] = 'm'
    args[#args + 1] = m
  end
  if #args > 1 then
    call('HSET', unpack(args))
  end
  if not exists then
    every = true
  end
  if every then
    call('PEXPIREAT', H, exp)
  end
  if every or fresh_ends then
    call('PEXPIREAT', ENDS, exp)
  end
  if w > 0 and (every or fresh_queue) then
    call('PEXPIREAT', QUEUE, exp)
  end
end
