-- semaphore: the prologue of the semaphore scripts (semaphore_*.lua), and
-- the functions they share.
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
--   fields reads the scalars and the caller's token (ARGV[1] of every
--   script); no call looks a token up in a set.
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
-- Numbers go to redis.call as Lua numbers (Redis formats them with 17
-- digits: exact), into stored text through string.format('%d') (exact;
-- concatenation would keep 14 digits only), and to replies as numbers
-- (Redis sends them as integers: exact).
-- Speed (issue 45): what a script costs is mostly Lua's own work per
-- script run (every table, closure, pattern and format), then the commands
-- it calls. So the state lives in locals, not tables; the prologue below
-- makes no closure and one table (put); the functions that only a sweep
-- or the queue needs are made only when that happens (sweep, pump); and
-- the counts (held, w, d) let a call skip what is empty: a call that finds
-- nothing due, no waiter and its end within exp runs no sweep, no pump and
-- no PEXPIREAT.
local H, HOLD, QUEUE, ALIVE, DONE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local call, format, floor = redis.call, string.format, math.floor
local t = call('TIME')
local now = t[1] * 1000 + floor(t[2] / 1000)
-- sweep bounds the expired entries one call removes, and the waiters one
-- call grants: the work of a call does not grow with the queue.
local sweep = 64
-- gap: the done set is swept at most once per gap ms (unless a sweep was
-- full).
local gap = 1000
local none = math.huge

-- The scalars (held0, w0, d0, m0: as stored) and the caller's field (v,
-- false when the token is unknown). exists: the hash keeps a scalar; sized:
-- it keeps a size (a cancel's record alone does not).
local v = call('HMGET', H, 'held', 'w', 'd', 'm', ARGV[1])
local m0 = v[4]
local exists = v[1] or v[2] or v[3] or m0
local held, w, d = tonumber(v[1]) or 0, tonumber(v[2]) or 0, tonumber(v[3]) or 0
local held0, w0, d0 = held, w, d
local size, fence, seq, due, dd, exp = 0, 0, 0, 0, 0, 0
if m0 then
  size, fence, seq, due, dd, exp = string.match(m0, '^(%d+):(%d+):(%d+):(%d+):(%d+):(%d+)$')
  size, fence, seq, due, dd, exp = tonumber(size), tonumber(fence), tonumber(seq), tonumber(due), tonumber(dd), tonumber(exp)
end
local sized = size > 0
if due == 0 then
  due = none
end
v = v[5]
