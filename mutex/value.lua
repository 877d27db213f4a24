-- value: the Lua function over a lock's value that the scripts acting only
-- for a holder share, prepended to them. A lock is a string: the owner's
-- token, then its mark (MARK_WAIT when a waiter asked to hear of the
-- release, MARK_FREE when none did), then, only once the owner re-entered,
-- LIST_SEP and the ids of its open handles between ID_SEPs (ROOT_LIST: the
-- root handle, ROOT_ID, alone); without that list the root handle alone is
-- open. value.go defines the layout, and its luaLayout gives the upper-case
-- names (lengths, positions, bytes) their values at init: no script knows
-- another.

-- held(key, token, handle) reports whether token owns the lock at key and,
-- unless handle is "" (any handle of the owner), whether that handle is open.
-- It returns the lock's value too (false when it is not held).
local function held(key, token, handle)
  local v = redis.call('GET', key)
  if not v or string.sub(v, 1, TOKEN_LEN) ~= token then
    return false
  end
  if handle == '' or (#v <= MARK_AT and handle == ROOT_ID) then
    return v
  end
  return #v > MARK_AT and string.find(v, ID_SEP .. handle .. ID_SEP, LIST_AT, true) ~= nil and v
end
