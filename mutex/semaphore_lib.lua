-- semaphore_lib: the functions of the semaphore scripts' general path
-- (after semaphore.lua and a script's fast path; see semaphore_scripts.go).
-- put: the token fields to write (false: delete); the fresh_ flags: the
-- sets this call created (they get exp); every: exp moved, touch every
-- key; hset: the holders set has members.
local put = {}
local fresh_hold, fresh_queue, fresh_alive, fresh_done, every = false, false, false, false, false
local hset = held > 0

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

-- grant makes tok a holder of n permits for lease ms from now; it returns
-- the end of the lease and the holder's fencing number, one more than the
-- last and never below the server's time in ms, so that a semaphore created
-- again after it expired goes on above the numbers it gave.
local function grant(tok, n, lease)
  fence = fence + 1
  if fence < now then
    fence = now
  end
  local ends = now + lease
  if not hset then
    fresh_hold, hset = true, true
  end
  call('ZADD', HOLD, ends, tok)
  held = held + n
  if ends < due then
    due = ends
  end
  if ends > exp then
    later(ends)
  end
  put[tok] = format('h%d:%d:%d', n, fence, ends)
  return ends, fence
end

-- first is the lowest score of a sorted set (none when it is empty).
local function first(key)
  local r = call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return r[2] and tonumber(r[2]) or none
end

-- drop_expired runs the sweeps that are due: holders whose lease ended
-- (their permits come back) and waiters that stopped polling when due has
-- come (then due is set to the earliest end left), records when dd has;
-- at most sweep of each. Only a call that finds one due makes it.
local function drop_expired()
  if due <= now then
    if held > 0 then
      local gone = call('ZRANGEBYSCORE', HOLD, '-inf', now, 'LIMIT', 0, sweep)
      if #gone > 0 then
        for i, f in ipairs(call('HMGET', H, unpack(gone))) do
          held = held - (holder(f) or 0)
          put[gone[i]] = false
        end
        call('ZREM', HOLD, unpack(gone))
        hset = held > 0
      end
    end
    if w > 0 then
      local dead = call('ZRANGEBYSCORE', ALIVE, '-inf', now, 'LIMIT', 0, sweep)
      if #dead > 0 then
        for _, tok in ipairs(dead) do
          put[tok] = false
        end
        call('ZREM', QUEUE, unpack(dead))
        w = w - call('ZREM', ALIVE, unpack(dead))
      end
    end
    due = none
    if held > 0 then
      due = first(HOLD)
    end
    if w > 0 then
      due = math.min(due, first(ALIVE))
    end
  end
  if d > 0 and dd <= now then
    local old = call('ZRANGEBYSCORE', DONE, '-inf', now, 'LIMIT', 0, sweep)
    if #old > 0 then
      d = d - call('ZREM', DONE, unpack(old))
      for _, tok in ipairs(old) do
        put[tok] = false
      end
    end
    dd = now
    if #old < sweep and d > 0 then
      local f = first(DONE)
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
    w = w - call('ZREM', ALIVE, tok)
    if n > 0 then
      local ends, fe = grant(tok, n, tonumber(lease))
      out = out or {}
      out[#out + 1] = format('%s:%d:%d', tok, ends, fe)
    end
  end
  if out then
    call('PUBLISH', channel, table.concat(out, ','))
  end
end

-- save writes back what the call changed (one HDEL, one HSET) and the
-- keys' expiry: every key that exists when exp moved (every), else the
-- sets this call created; or it deletes the hash once nothing is held,
-- queued or recorded.
local function save()
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
  if held ~= held0 then
    args[#args + 1] = 'held'
    args[#args + 1] = held
  end
  if w ~= w0 then
    args[#args + 1] = 'w'
    args[#args + 1] = w
  end
  if d ~= d0 then
    args[#args + 1] = 'd'
    args[#args + 1] = d
  end
  local m = format('%d:%d:%d:%d:%d:%d', size, fence, seq, due == none and 0 or due, dd, exp)
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
  if held > 0 and (every or fresh_hold) then
    call('PEXPIREAT', HOLD, exp)
  end
  if w > 0 and (every or fresh_queue) then
    call('PEXPIREAT', QUEUE, exp)
  end
  if w > 0 and (every or fresh_alive) then
    call('PEXPIREAT', ALIVE, exp)
  end
  if d > 0 and (every or fresh_done) then
    call('PEXPIREAT', DONE, exp)
  end
end
