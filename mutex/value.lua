-- value: the Lua functions over a lock's value, prepended to the scripts
-- that act only for a holder. A lock is a string: the owner's token, then
-- its mark (MARK_WAIT when a waiter asked to hear of the release, MARK_FREE
-- when none did), then, only once the owner re-entered, LIST_SEP and the ids
-- of its open handles between ID_SEPs (ROOT_IDS: the root handle, ROOT_ID, alone);
-- without that list the root handle alone is open. value.go defines the
-- layout and declares its lengths, positions and bytes as locals before
-- these lines (valueLocals): no script knows another.

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

-- unlisted(v, handle) returns the value v of a re-entered lock with handle,
-- which its list holds (held), taken off the list, and the number of handles
-- left open; nil when none is left.
local function unlisted(v, handle)
  local list, item = string.sub(v, LIST_AT), ID_SEP .. handle .. ID_SEP
  local at = string.find(list, item, 1, true)
  -- Cut the handle and the ID_SEP before it.
  list = string.sub(list, 1, at - 1) .. string.sub(list, at + #item - #ID_SEP)
  if list == ID_SEP then
    return nil
  end
  local _, seps = string.gsub(list, ID_SEP, ID_SEP)
  return string.sub(v, 1, LIST_AT - 1) .. list, seps - 1
end
