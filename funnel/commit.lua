-- commit: write a batch's decisions without the lock, if the state is still
-- what they were decided on (a crowded key's batches: crowded.go). It
-- is the lock's guarantee, checked in one script: nobody wrote between the
-- read and this write, and nobody holds the lock now (a holder may be
-- between its own read and write).
-- KEYS[1] the state hash, KEYS[2] the key's lock
-- ARGV the rules' fields (k of them); the values the decisions were made on
-- (k, '' for none); the key's TTL in ms; the deadline (server µs from which
-- the write is refused, 0 for none); the new values (k, '' to delete: a
-- batch that admitted a call writes every rule's field); this commit's
-- nonce, which ends every value written: this commit run again (its reply
-- lost, go-redis retried it) finds its own values and answers 1 again.
-- Returns 1 when written; minus the server time when it ran at or past the
-- deadline (nothing written); else read.lua's reply, {proceed, now,
-- value...}, with proceed -1 when the lock is held (the batch takes it)
-- and 0 or 1 when the state changed (the batch is decided again on it).
local mark = ':' .. table.remove(ARGV)
local k = (#ARGV - 2) / 3
local a = {} -- the values seen, the TTL, the deadline, the new values
for i = k + 1, #ARGV do
  a[i - k] = ARGV[i]
end
for i = #ARGV, k + 1, -1 do
  ARGV[i] = nil
end
local busy = redis.call('EXISTS', KEYS[2]) == 1
local r = read_state()
for i = 3, k + 2 do
  local v = r[i]
  if v then -- the first value present tells whether this commit wrote it
    if string.sub(v, -#mark) == mark then
      return 1
    end
    break
  end
end
if busy then
  r[1] = -1
  return r
end
for i = 1, k do
  if (r[i + 2] or '') ~= a[i] then
    return r
  end
end
local deadline = tonumber(a[k + 2])
if deadline > 0 and r[2] >= deadline then
  return -r[2]
end
local set, del = {}, {}
for i = 1, k do
  local v = a[k + 2 + i]
  if v == '' then
    del[#del + 1] = ARGV[i]
  else
    set[#set + 1] = ARGV[i]
    set[#set + 1] = v .. mark
  end
end
if #set > 0 then
  redis.call('HSET', KEYS[1], unpack(set))
end
if #del > 0 then
  redis.call('HDEL', KEYS[1], unpack(del))
end
-- The key's TTL only grows: other rules' fields may need the longer one.
local ttl = tonumber(a[k + 1])
if ttl > 0 and redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 1
