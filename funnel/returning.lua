-- returning: Allow's gate for a key whose state this process has seen
-- (gate.go). It admits the call in this one round trip when the key's
-- lock is free and each of the call's funnels holds nothing or the very
-- value the caller saw, for which the caller worked out the decision in
-- advance, as server times: the call fits from <fit> on; the funnel is empty
-- from <empty> on, and then starts over as admit.lua's does ("<wait>:<fill>:"
-- and the server's time); before <empty>, the new value is the one the
-- caller computed, whole, anchored at <anchor> (at or after <fit>: the
-- caller's estimate of the server's time; a server clock behind it makes the
-- call read as read.lua). So Redis compares times and writes strings: the
-- arithmetic stays the caller's, exact. Otherwise it is read.lua's gate
-- (read_state): the lock is busy, or another process changed the state.
-- KEYS[1] the state hash, KEYS[2] the key's lock
-- ARGV the rules' fields (k of them); then for each rule 9 values: the value
-- seen ('' for none), <fit>, <anchor>, <empty> (server µs, decimal), the new
-- value before <empty> and the key's expiry with it (Unix ms), the new value
-- from <empty> on without its time and the key's TTL with it (ms), and the
-- rule's grid (ms); then the call's deadline (server µs; 0 for none) and
-- this call's nonce.
-- The key's expiry: every write of a funnel's value v gives the key at
-- least the grid point at or after v's empty time (ms; math.go's expiryOf),
-- so the values present bound it, and a key that keeps coming back needs no
-- PEXPIRE until its new values pass their grid point.
-- Returns read.lua's reply (proceed 0: denied, on the values seen; 2: the
-- lock is held), or
-- {0, now, 'admitted', how} when admitted here (the lock is not taken):
-- how has a letter per rule, 'k' where the new value was the caller's, 'f'
-- where the funnel started over; or {0, now, 'late'} when it ran at or past
-- the deadline: then it wrote nothing. Every value written ends in
-- ":<nonce>": this call run again (its reply lost, go-redis retried it)
-- answers 'admitted' instead of counting twice.
local n = #ARGV
local k = (n - 2) / 10
local deadline, mark = tonumber(ARGV[n - 1]), ':' .. ARGV[n]
local a = ARGV -- rule i's 9 values from a[k + 9 * (i - 1) + 1] on
if redis.call('EXISTS', KEYS[2]) == 1 then
  local r = read_state(k)
  r[1] = r[1] * 2 -- 2: the lock is held (0: denied on the values read)
  return r
end
local now, got = read_values(k)
local changed = false
for i = 1, k do -- an empty field (expired) starts over, whatever was seen
  local v = got[i]
  if v and v ~= a[k + 9 * (i - 1) + 1] then
    changed = true
    break
  end
end
if changed then
  -- Another process wrote, or this very call did (an admission writes every
  -- rule's field: the first one present tells). Values the caller saw end in
  -- another call's nonce, so this check waits until they changed.
  for i = 1, k do
    local v = got[i]
    if v then
      if string.sub(v, -#mark) == mark then
        return {0, now, 'admitted', ''}
      end
      break
    end
  end
end
if deadline > 0 and now >= deadline then
  return {0, now, 'late'}
elseif changed then
  return read_reply(now, got)
end
for i = 1, k do
  -- The values are those seen: <fit> is at or after each rule's gate, so
  -- this is read.lua's denial too.
  if got[i] and now < tonumber(a[k + 9 * (i - 1) + 2]) then
    local r = read_reply(now, got)
    r[1] = 0 -- denied: read.lua's reply, declined
    return r
  end
end
-- ms: the key's expiry is at least bound, and must be at least exp
local nowms = (now - now % 1000) / 1000
local how, values, bound, exp, at = {}, {}, 0, 0, nil
for i = 1, k do
  local b, v = k + 9 * (i - 1), got[i]
  local g = tonumber(a[b + 9])
  if v then -- the value seen: its grid point
    local e = tonumber(a[b + 4]) + 999
    e = (e - e % 1000) / 1000
    bound = math.max(bound, e + (g - e % g) % g)
  end
  if v and now < tonumber(a[b + 4]) then
    if now < tonumber(a[b + 3]) then
      return read_reply(now, got) -- the server's clock is behind the caller's estimate
    end
    how[i], values[i] = 'k', a[b + 5] .. mark
    exp = math.max(exp, tonumber(a[b + 6]))
  else
    if not at then -- the time in base 36, as admit.lua writes it
      local ds, j, x = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 13, now
      repeat
        local d = x % 36
        ds[j] = d < 10 and d + 48 or d + 87
        j = j - 1
        x = (x - d) / 36
      until x == 0
      at = string.char(unpack(ds, j + 1, 13))
    end
    how[i], values[i] = 'f', a[b + 7] .. at .. mark
    local e = nowms + tonumber(a[b + 8]) + 1 -- + 1: TIME's µs past its ms
    exp = math.max(exp, e + (g - e % g) % g)
  end
end
if k == 1 then
  redis.call('HSET', KEYS[1], ARGV[1], values[1])
else
  local args = {}
  for i = 1, k do
    args[2 * i - 1], args[2 * i] = ARGV[i], values[i]
  end
  redis.call('HSET', KEYS[1], unpack(args))
end
how = table.concat(how)
if exp <= bound then
  return {0, now, 'admitted', how}
end
-- The key's TTL only grows: other rules' fields may need the longer one.
-- A key that held one of these fields has a TTL (every write gives one):
-- PEXPIREAT GT keeps the longer in one command (Redis 7.0 on; before, an
-- error, and PTTL's test below). A key that may be new gets it from that
-- test (a key without a TTL reads -1).
if bound > 0 and type(redis.pcall('PEXPIREAT', KEYS[1], exp, 'GT')) ~= 'table' then
  return {0, now, 'admitted', how}
end
if redis.call('PTTL', KEYS[1]) < exp - nowms then
  redis.call('PEXPIREAT', KEYS[1], exp)
end
return {0, now, 'admitted', how}
