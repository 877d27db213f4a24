-- acquire: take the lock, or re-enter it, and set its lease.
-- The lock is a string, read and written through value.lua's functions: the
-- owner's token, its mark, and once the owner re-entered, the list of its
-- open handles. A free lock is taken with one SET NX PX.
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
  if redis.call('SET', KEYS[1], value_new(ARGV[1]), 'NX', 'PX', ARGV[3]) then
    return {1, lease, bump_fence(KEYS[2], ARGV[4])}
  end
  local v = redis.call('GET', KEYS[1])
  if v and value_token(v) == ARGV[1] then
    return {1, redis.call('PTTL', KEYS[1]), last_fence(KEYS[2], ARGV[4])}
  end
  if mode == 'm' then
    value_mark(KEYS[1])
  end
  return {0, redis.call('PTTL', KEYS[1]), 0}
end
local v = redis.call('GET', KEYS[1])
if not v then
  return {0, -2, 0}
end
if value_token(v) ~= ARGV[1] then
  return {0, redis.call('PTTL', KEYS[1]), 0}
end
-- Re-entry: add the handle to the owner's list (the root's alone before).
local reentered = value_with_handle(v, mode)
if reentered then
  redis.call('SET', KEYS[1], reentered, 'KEEPTTL')
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl < lease then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  pttl = lease
end
return {1, pttl, 0}
