-- admit: Allow's gate. It admits the call in this one round trip when none
-- of the call's rules has state (a first call, or every funnel of them empty
-- and expired) and the key's lock is free: nobody is between a read and a
-- write of the key, and an empty state needs no arithmetic, so the new
-- values, computed by the caller for this call's units, are written as they
-- are, at the server's time. Otherwise it is read.lua's gate (read_state,
-- that file's functions, which gate.go puts in place of the line
-- "-- read.lua" below).
-- KEYS[1] the state hash, KEYS[2] the key's lock
-- ARGV the rules' fields (k of them); then each rule's new value without its
-- time, "<wait>:<fill>:" in base 36 (k); the key's TTL in ms; the grid (ms,
-- a power of two) its expiry is rounded up to (the rules' largest, see
-- returning.lua); the call's
-- deadline: the server time (µs) from which its caller may have given up,
-- 0 for none, -1 to admit only through the lock (serverclock.go); this
-- call's nonce.
-- Returns read.lua's reply (proceed 2 when the fields are empty and the
-- lock is held), or {0, now, 'admitted'} when this call was
-- admitted here (proceed 0: the lock is not taken), or {0, now, 'late'}
-- when it runs at or past its deadline: then it writes nothing and takes no
-- lock (its caller has an error, or will have one). The value written ends
-- in ":<nonce>", so that this very call run again (its reply was lost, and
-- go-redis retried it) answers 'admitted' again instead of counting twice,
-- even past its deadline.
local n = #ARGV
local k = (n - 4) / 2
local ttl, grid = tonumber(ARGV[n - 3]), tonumber(ARGV[n - 2])
local mark = ':' .. ARGV[n] -- this call's nonce
local deadline = tonumber(ARGV[n - 1])
-- One EXISTS of both keys first: 0 when the lock is free and the state is
-- new (a first call, most admissions), which then needs no HMGET and no
-- PTTL: every redis.call costs ~1.5 µs of Lua around the command's own time.
local new = redis.call('EXISTS', KEYS[1], KEYS[2]) == 0
local r
-- ARGV[k + i] is rule i's new value (read_state(k) reads the k fields
-- before it).
if new then
  local t = redis.call('TIME')
  r = {1, tonumber(t[1]) * 1000000 + tonumber(t[2])}
  if deadline > 0 and r[2] >= deadline then
    return {0, r[2], 'late'}
  elseif deadline < 0 then -- read.lua's reply: an empty state
    for i = 1, k do
      r[i + 2] = false
    end
    return r
  end
else
  -- read.lua (its functions, spliced here by gate.go: a first call, which
  -- does not read, makes none of their three closures, 0.4 µs of ~12 a call)
  r = read_state(k)
  local v
  for i = 3, k + 2 do
    v = r[i]
    if v then
      break
    end
  end
  -- An admission writes every rule's field: the first one present tells.
  if v and string.sub(v, -#mark) == mark then
    return {0, r[2], 'admitted'}
  elseif deadline > 0 and r[2] >= deadline then
    return {0, r[2], 'late'}
  elseif v or deadline < 0 then
    return r
  elseif redis.call('EXISTS', KEYS[2]) == 1 then
    r[1] = 2 -- the lock is held (no rule is full: the fields are empty)
    return r
  end
end
-- The time in base 36: its digits' bytes collected, then one string.char
-- (a string.sub and a concatenation per digit cost ~2 µs here). The table
-- is made whole at once (36^11 > 2^53: 13 slots hold any time), not grown.
local ds, j, x = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 13, r[2]
repeat
  local d = x % 36
  ds[j] = d < 10 and d + 48 or d + 87 -- '0'..'9', 'a'..'z'
  j = j - 1
  x = (x - d) / 36
until x == 0
local at = string.char(unpack(ds, j + 1, 13))
if k == 1 then -- most calls: no table to build and unpack
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[k + 1] .. at .. mark)
else
  local args = {}
  for i = 1, k do
    args[2 * i - 1] = ARGV[i]
    args[2 * i] = ARGV[k + i] .. at .. mark
  end
  redis.call('HSET', KEYS[1], unpack(args))
end
-- The key lives to the grid point at or after its values' empty time (ms,
-- + 1 for the µs TIME has past its ms). Its TTL only grows: other rules'
-- fields may need the longer one.
local nowms = (r[2] - r[2] % 1000) / 1000
local exp = nowms + ttl + 1
exp = exp + (grid - exp % grid) % grid
if new or redis.call('PTTL', KEYS[1]) < exp - nowms then
  redis.call('PEXPIREAT', KEYS[1], exp)
end
return {0, r[2], 'admitted'}
