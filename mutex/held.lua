-- held: a Lua function prepended to the scripts that act only for a holder.
-- A lock is a string: the owner's 32-character token; then "w" when a waiter
-- asked to hear of the release (a release then publishes), "-" when none
-- did; then, only once the owner re-entered, ":" and the ids of its open
-- handles between commas (",0,2,"). Without that list the root handle 0 alone
-- is open. One GET reads it all, and a plain lock is one SET NX PX.
-- held(key, token, handle) reports whether token owns the lock at key and,
-- unless handle is "" (any handle of the owner), whether that handle is open.
-- It returns the lock's value too (false when it is not held).
local function held(key, token, handle)
  local v = redis.call('GET', key)
  if not v or string.sub(v, 1, 32) ~= token then
    return false
  end
  if handle == '' or (#v <= 33 and handle == '0') then
    return v
  end
  return #v > 33 and string.find(v, ',' .. handle .. ',', 35, true) ~= nil and v
end
