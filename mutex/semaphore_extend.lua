-- semaphore_extend: set the lease of a holder's permits to ARGV[2] ms from
-- now (after semaphore.lua, whose KEYS it takes). ARGV[1] token.
-- Returns {1, now, lease end}, or {0, now} when the token holds nothing
-- (its lease ended, or it was released). Running it twice sets the same
-- lease, from a later now.
local tok = ARGV[1]
-- general path
local n, fe, ends_at = holder(v)
if not ends_at or ends_at <= now then
  return {0, now}
end
local e = now + tonumber(ARGV[2])
call('ZADD', ENDS, 'XX', e, tok)
put[tok] = format('h%d:%d:%d', n, fe, e)
if e < due then
  due = e
end
later(e)
save()
return {1, now, e}
