-- record: Lua functions prepended to the release scripts. A release leaves
-- a record for record_px ms (set before these lines, as text: a Lua number
-- passed to redis.call is formatted at a cost), so that the same release
-- run again (its reply was lost and go-redis, or the caller, retried)
-- answers what the first run did, not "not held".
--
-- Where. The name's record key (its kind "record") keeps one record: a
-- release writes it there when it is free, or when the record in it came
-- from a release of the same Locker whose reply that Locker has had since
-- (so nobody will run that release again). Otherwise the record goes to a
-- key of the release's own token (kind "record:<token>"), which nothing
-- overwrites. A name released again and again by one Locker so costs one
-- overwrite of one key per release, not a new key each time, and no record
-- is lost while its release may still be retried.
--
-- The caller's stamp says which of its releases have their reply: three
-- 64-bit numbers as hex digits of one width (stamp.go's stampDigits), the
-- Locker's id (owner), this release's number in that Locker (seq), and
-- mark: every release of the Locker numbered below mark has had its reply.
--
-- A record is "<owner><seq>:<token>:<call>:<handles left>:<fence>:<result>".
-- The call identifies the release (call_id) so that only the very same call
-- is answered from the record: another call through the same handle (a
-- commit after a plain release) is not. A result is kept as 'n' and a
-- number, 's' and a string, 't' (true), 'f' (false or none), or 'x' (a
-- table: not kept).
--
-- unlock.lua writes its records with the same steps, inline (a function
-- call costs that short script a good part of its time): keep them alike.

-- call_id is the call of a fragment's release: a digest of its kind, all
-- KEYS and all ARGV but the stamp (the last three), which differs when the
-- caller makes the same call again.
local function call_id(kind)
  return redis.sha1hex(kind .. '\0' .. table.concat(KEYS, '\0') .. '\0\0' ..
    table.concat(ARGV, '\0', 1, #ARGV - 3))
end

-- record writes the record of a release: to the name's key (nkey) unless
-- the record there may still be asked for, else to the token's (tkey).
local function record(nkey, tkey, owner, seq, mark, token, call, left, fence, res)
  local t, enc = type(res), 'x'
  if t == 'number' then
    enc = 'n' .. string.format('%.17g', res)
  elseif t == 'string' then
    enc = 's' .. res
  elseif res == true then
    enc = 't'
  elseif not res then
    enc = 'f'
  end
  if fence ~= 0 then
    fence = string.format('%d', fence) -- a Lua number prints 14 digits at most
  end
  local rec = owner .. seq .. ':' .. token .. ':' .. call .. ':' .. left .. ':' .. fence .. ':' .. enc
  -- The name's key lives record_keep ms (3 * record_px) after each write;
  -- a record put back keeps that too, longer than it had left.
  local old = redis.call('SET', nkey, rec, 'PX', record_keep, 'GET')
  -- Unless the record there is this owner's (its first #owner characters)
  -- and numbered below mark (the next #mark: seq and mark are lower-case hex
  -- digits of one width, so text order is number order), it may still be
  -- asked for: put it back, and keep this one at the token's key.
  if old and (string.sub(old, 1, #owner) ~= owner or string.sub(old, #owner + 1, #owner + #mark) >= mark) then
    redis.call('SET', nkey, old, 'KEEPTTL')
    redis.call('SET', tkey, rec, 'PX', record_px)
  end
end

local function recalled(key, token, call)
  local v = redis.call('GET', key)
  if not v then
    return nil
  end
  local tok, c, left, fence, kind, body = string.match(v, '^%x*:([^:]*):([^:]*):(%d+):(%d+):(.)(.*)$')
  if tok ~= token or c ~= call then
    return nil
  end
  left, fence = tonumber(left), tonumber(fence)
  if kind == 'n' then
    return {left, fence, tonumber(body), 1}
  elseif kind == 's' then
    return {left, fence, body, 1}
  elseif kind == 't' then
    return {left, fence, true, 1}
  elseif kind == 'f' then
    return {left, fence, false, 1}
  end
  return {left, fence, false, 2}
end

-- recall returns the reply of token's recorded release made by call, with a
-- fourth element 1 (a replay) or 2 (a replay whose result was not kept), or
-- nil.
local function recall(nkey, tkey, token, call)
  return recalled(nkey, token, call) or recalled(tkey, token, call)
end
