-- held: a Lua function prepended to the scripts that act only for a holder.
-- held(key, token, handle) reports whether token owns the lock at key and,
-- unless handle is "" (any handle of the owner), whether that handle is open.
local function held(key, token, handle)
  if redis.call('HGET', key, 't') ~= token then
    return false
  end
  return handle == '' or redis.call('HEXISTS', key, 'h' .. handle) == 1
end
