-- value: the Lua functions over a lock's value, the only Lua that knows its
-- layout. A lock is a string: the owner's token, then its mark (MARK_WAIT
-- when a waiter asked to hear of the release, MARK_FREE when none did),
-- then, only once the owner re-entered, LIST_SEP and the ids of its open
-- handles between ID_SEPs (ROOT_LIST: the root handle, ROOT_ID, alone);
-- without that list the root handle alone is open. value.go defines the
-- layout, and its luaLayout gives the upper-case names (lengths, positions,
-- bytes) their values at init. The scripts read and write a value only
-- through these functions.
--
-- A script gets, prepended, only the functions below that it calls (value.go's
-- withValue): each one defined costs every run a closure, called or
-- not. A function calls only functions above it. Each is one block, its
-- comment and then its code, with no blank line inside.

-- value_new(token, marked) is the value of token's lock, marked by a waiter
-- or not (nil: not), with no list: the root handle alone open.
local function value_new(token, marked)
  if marked then
    return token .. MARK_WAIT
  end
  return token .. MARK_FREE
end

-- value_token(v) is the token of the lock whose value is v.
local function value_token(v)
  return string.sub(v, 1, TOKEN_LEN)
end

-- value_marked(v) reports whether a waiter marked the lock whose value is v.
local function value_marked(v)
  return string.byte(v, MARK_AT) == WAIT_BYTE
end

-- value_mark(key) marks the lock at key, which exists, as waited for, in
-- place (its token, lease and list stay).
local function value_mark(key)
  redis.call('SETRANGE', key, MARK_OFFSET, MARK_WAIT)
end

-- value_with_handle(v, id) is v with handle id open too, or nil when it is
-- open already (v then stays as it is).
local function value_with_handle(v, id)
  local list = ROOT_LIST
  if #v > MARK_AT then
    list = string.sub(v, LIST_AT)
  end
  if string.find(list, ID_SEP .. id .. ID_SEP, 1, true) then
    return nil
  end
  return string.sub(v, 1, MARK_AT) .. LIST_SEP .. list .. id .. ID_SEP
end

-- value_without_handle(v, id) closes handle id, which is open in v: it
-- returns the new value and how many handles stay open, or nil and 0 when
-- id was the last (the lock is then to be released or handed over).
local function value_without_handle(v, id)
  if #v <= MARK_AT then
    return nil, 0
  end
  local list = string.sub(v, LIST_AT)
  local at = string.find(list, ID_SEP .. id .. ID_SEP, 1, true)
  -- Keep the ID_SEP before the id; go on past the id and the one after it.
  list = string.sub(list, 1, at) .. string.sub(list, at + #id + 2)
  if list == ID_SEP then
    return nil, 0
  end
  local _, seps = string.gsub(list, ID_SEP, ID_SEP)
  return string.sub(v, 1, LIST_AT - 1) .. list, seps - 1
end

-- value_root_only(v, free) reports whether v is the value of the lock that
-- took the value free (value_new of its token) with the root handle alone
-- open: never re-entered, or all its re-entries closed. When it is, it
-- returns too whether a waiter marked it. v may be false (no lock).
local function value_root_only(v, free)
  if not v or string.sub(v, 1, TOKEN_LEN) ~= string.sub(free, 1, TOKEN_LEN) or (#v ~= MARK_AT and string.sub(v, LIST_AT) ~= ROOT_LIST) then
    return false
  end
  return true, string.byte(v, MARK_AT) == WAIT_BYTE
end

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
