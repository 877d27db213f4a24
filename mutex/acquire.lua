-- acquire: take the lock, or re-enter it, and set its lease.
-- The lock is a string (see value.go, whose luaLayout gives the upper-case
-- names their values at init): the owner's token, its mark, and once the
-- owner re-entered, the list of its open handles. A free lock is taken with
-- one SET NX PX.
-- KEYS[1] the lock key, KEYS[2] the fencing counter key (with fencing only)
-- ARGV[1] token, ARGV[2] what to do: "" take a free lock, "m" the same and
-- mark the lock if it is held, or a handle id (digits) to re-enter a lock
-- this token holds (never creates one), ARGV[3] lease in ms,
-- ARGV[4] fencing counter TTL in ms (0: off)
-- Returns {1, lease ms, fence} when this token holds the lock now;
-- {0, PTTL, 0} when it does not (PTTL is -2 when re-entry found no lock).
-- Safe to run twice (go-redis retries a script whose reply was lost): a
-- token that finds the lock its own already took it, and a re-entered
-- handle is listed once.
-- The lease goes to redis.call as the text it came as (a Lua number would
-- be formatted, at a cost); lease is its number, for comparisons.
local lease = tonumber(ARGV[3])
local mode = ARGV[2]
if mode == '' or mode == 'm' then
  if redis.call('SET', KEYS[1], ARGV[1] .. MARK_FREE, 'NX', 'PX', ARGV[3]) then
    return {1, lease, bump_fence(KEYS[2], ARGV[4])}
  end
  local v = redis.call('GET', KEYS[1])
  if v and string.sub(v, 1, TOKEN_LEN) == ARGV[1] then
    return {1, redis.call('PTTL', KEYS[1]), last_fence(KEYS[2], ARGV[4])}
  end
  if mode == 'm' then
    redis.call('SETRANGE', KEYS[1], MARK_OFFSET, MARK_WAIT)
  end
  return {0, redis.call('PTTL', KEYS[1]), 0}
end
local v = redis.call('GET', KEYS[1])
if not v then
  return {0, -2, 0}
end
if string.sub(v, 1, TOKEN_LEN) ~= ARGV[1] then
  return {0, redis.call('PTTL', KEYS[1]), 0}
end
-- Re-entry: add the handle to the owner's list (the root's alone before).
local list = ROOT_LIST
if #v > MARK_AT then
  list = string.sub(v, LIST_AT)
end
if not string.find(list, ID_SEP .. mode .. ID_SEP, 1, true) then
  redis.call('SET', KEYS[1], string.sub(v, 1, MARK_AT) .. LIST_SEP .. list .. mode .. ID_SEP, 'KEEPTTL')
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl < lease then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  pttl = lease
end
return {1, pttl, 0}
