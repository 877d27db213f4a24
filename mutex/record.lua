-- record: Lua functions prepended to the release scripts. A release leaves
-- a record for record_ms (set before these lines), so that the same release
-- run again (its reply was lost and go-redis, or the caller, retried)
-- answers what the first run did, not "not held".
-- The record key is the lock's with "released:<token>" for "lock"; its value
-- "<call>:<handles left>:<fence>:<result>" (see record). The call is a
-- digest of the script's kind and all its KEYS and ARGV (call_id), so only
-- the very same call is answered from the record: another call through the
-- same handle (a commit after a plain release) is not. A result is kept as
-- 'n' and a number, 's' and a string, 't' (true), 'f' (false or none), or
-- 'x' (a table: not kept).
local function call_id(kind)
  return redis.sha1hex(kind .. '\0' .. table.concat(KEYS, '\0') .. '\0\0' .. table.concat(ARGV, '\0'))
end

local function record(key, call, left, fence, res)
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
  redis.call('SET', key, call .. ':' .. string.format('%d:%d:', left, fence) .. enc, 'PX', record_ms)
end

-- recall returns the reply of the recorded release made by call, with a
-- fourth element 1 (a replay) or 2 (a replay whose result was not kept), or
-- nil.
local function recall(key, call)
  local v = redis.call('GET', key)
  if not v then
    return nil
  end
  local h, left, fence, kind, body = string.match(v, '^([^:]*):(%d+):(%d+):(.)(.*)$')
  if h ~= call then
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
