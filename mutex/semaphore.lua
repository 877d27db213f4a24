-- semaphore: the prologue of the semaphore scripts (semaphore_*.lua): the
-- server's time, the state read into locals. A script is this prologue,
-- its body's fast path, then semaphore_lib.lua's functions and its body's
-- general path (semaphore_scripts.go).
-- All keys of one semaphore share the name's hash tag:
-- KEYS[1] a hash: m, the scalars in one JSON array
--   "[<held>,<w>,<d>,<size>,<fence>,<seq>,<due>,<dd>,<exp>]" (held the sum of
--   the holders' weights; w the waiters queued; d the records; size N;
--   fence the last fencing number; seq the waiters' last sequence number;
--   due at most the earliest end among holders and waiters, 0 for none; dd
--   when records are swept next; exp when every key expires), and one field
--   per token (the token itself, 32 hex digits, never "m"), its state in one
--   value: "h<n>:<fence>:<lease end>" a holder of n permits,
--   "w<n>:<lease>:<seq>" a waiter for n permits (lease: the ms it asked
--   for; seq: its place), "d" a token released or cancelled (a record). One
--   HMGET of two fields reads the scalars and the caller's token (ARGV[1] of
--   every script), one HSET writes them back; no call looks a token up in a
--   set. (Each field a script reads or writes costs about as much as a
--   tenth of a command: one value for the scalars took 3 µs off a script;
--   cjson.decode reads it 0.5-2 µs faster than a pattern and nine tonumbers.)
-- KEYS[2] ends: every token's end in one sorted set (server ms): a
--   holder's lease end, a waiter's wait-lease end (a waiter that stops
--   polling is passed over once it ends), and a record's end plus rec0 =
--   2^52, so that records sort after every holder and waiter: a range up
--   to now finds the holders and waiters that ended, the first member the
--   earliest of their ends. A record lets a retried release answer as its
--   first run, and a late acquire of an ended token take nothing; it is
--   removed up to a second after its end (sweeps are batched): it only
--   lives longer. A token changes state by a new score, in one ZADD: a
--   holder's release, a waiter's grant, a poll.
-- KEYS[3] queue: waiters scored by their sequence number (FIFO)
-- Every key expires at exp, which is never before the latest end the sets
-- record and at most a quarter of that end's lease after it: it is moved
-- (every key touched) only when an end passes it, and a set created by a
-- call gets it then. An idle semaphore leaves nothing behind.
-- Every number is an integer below 2^53, so Lua's doubles hold it exactly:
-- size and the weights are at most 2^53 - 1 (refused above by the Go side),
-- held never exceeds size (a grant is tested as n <= size - held, which
-- cannot round), times are server ms (below 2^42 until the year 2109) plus
-- leases of at most a day, and a record's score is rec0 plus such a time.
-- Numbers go to redis.call as Lua numbers (Redis formats them with 17
-- digits: exact), into stored text through string.format('%d') (exact;
-- concatenation would keep 14 digits only), and to replies as numbers
-- (Redis sends them as integers: exact).
-- Speed (issue 45): a script's time is mostly the commands it calls and
-- Lua's own work per run (each table, closure, pattern and format). So the
-- state lives in locals; the common calls (an uncontended acquire and
-- release, a waiter's poll, a new waiter) return on their body's fast
-- path, which makes no closure and no table but the reply; the counts
-- (held, w, d) let a call skip what is empty: a call that finds nothing
-- due, no waiter and its end within exp runs no sweep, no pump and no
-- PEXPIREAT. An uncontended acquire runs TIME, HMGET, ZADD and HSET, and
-- so does its release.
local H, ENDS, QUEUE = KEYS[1], KEYS[2], KEYS[3]
local call, format, floor = redis.call, string.format, math.floor
local t = call('TIME')
local now = t[1] * 1000 + floor(t[2] / 1000)
local rec0 = 4503599627370496 -- 2^52
-- sweep bounds the expired entries one call removes, and the waiters one
-- call grants: the work of a call does not grow with the queue.
local sweep = 64
-- gap: records are swept at most once per gap ms (unless a sweep was
-- full).
local gap = 1000
local none = math.huge

-- The scalars (m0: as stored) and the caller's field (v, false when the
-- token is unknown). exists: the hash keeps the scalars; sized: they keep
-- a size (a cancel's record alone does not). The ends set has members
-- exactly when held, w or d is above 0.
local v = call('HMGET', H, 'm', ARGV[1])
local m0 = v[1]
local exists = m0
local held, w, d, size, fence, seq, due, dd, exp = 0, 0, 0, 0, 0, 0, 0, 0, 0
if m0 then
  if string.byte(m0) ~= 91 then -- '[': else the keys of an earlier layout (until they expire)
    return redis.error_reply('ERR semaphore ' .. H .. ' is kept in another layout (an older version of funnelguard)')
  end
  held, w, d, size, fence, seq, due, dd, exp = unpack(cjson.decode(m0))
end
local sized = size > 0
if due == 0 then
  due = none
end
v = v[2]
-- M: the format of m.
local M = '[%d,%d,%d,%d,%d,%d,%d,%d,%d]'
