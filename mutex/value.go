package mutex

import (
	"encoding/hex"
	"strconv"
)

// A lock's value is one string, so that one GET reads all of it and a plain
// lock is one SET NX PX:
//
//	<token><mark>[<listSep><idSep><id><idSep>...]
//
// The token is the owner's: tokenLen lower-case hex digits of random bits
// (128), new for each acquisition. The mark is markWait when a waiter asked
// to hear of the release (a release then publishes), markFree when none did.
// Only once the owner re-entered come listSep and the ids of its open handles,
// each between two idSeps (":,0,2,"); without that list the root handle
// (rootID) alone is open, as with the list of it alone (rootIDs).
//
// This is the layout's one definition: the constants and functions below for
// Go, and for Lua the locals of valueLocals, made from these constants, which
// every script that reads or writes a lock's value starts with, and
// value.lua's functions over them. A script builds a value as its token
// followed by its mark: no script knows a length or a position but these.
// The marks and separators are single bytes; idSep is none of Lua's pattern
// characters (value.lua counts idSeps with string.gsub).
const (
	tokenLen = 32          // hex digits of a token, at the start of the value
	markAt   = tokenLen    // index of the mark
	headLen  = markAt + 1  // length of a value without a list
	listAt   = headLen + 1 // index of the list's first idSep, after listSep

	markFree = '-'
	markWait = 'w'
	listSep  = ':'
	idSep    = ','
	rootID   = "0"
)

// rootIDs is the list of the root handle alone.
const rootIDs = string(idSep) + rootID + string(idSep)

// valueLocals declares the layout for the Lua scripts, as 1-based positions
// (string.sub) and text (redis.call formats a Lua number at a cost):
// TOKEN_LEN, the token's length and last position; MARK_AT, the mark's
// position and the length of a value without a list; LIST_AT, the position
// of the list's first ID_SEP; MARK_OFFSET, the mark's offset for SETRANGE;
// MARK_FREE, MARK_WAIT, LIST_SEP, ID_SEP; ROOT_ID, the root handle's id, and
// ROOT_IDS, the list of it alone. Locals cost a script nothing measurable; a function defined
// in it costs each run a closure (~40 ns), so the scripts whose every
// microsecond counts (acquire.lua, unlock.lua) use these locals alone, and
// value.lua's functions serve the others.
var valueLocals = "local TOKEN_LEN, MARK_AT, LIST_AT, MARK_OFFSET = " +
	strconv.Itoa(tokenLen) + ", " + strconv.Itoa(markAt+1) + ", " + strconv.Itoa(listAt+1) + ", " +
	strconv.Quote(strconv.Itoa(markAt)) + "\n" +
	"local MARK_FREE, MARK_WAIT, LIST_SEP, ID_SEP, ROOT_ID, ROOT_IDS = " +
	strconv.QuoteRune(markFree) + ", " + strconv.QuoteRune(markWait) + ", " +
	strconv.QuoteRune(listSep) + ", " + strconv.QuoteRune(idSep) + ", " +
	strconv.Quote(rootID) + ", " + strconv.Quote(rootIDs) + "\n"

// putFreeValue writes to v[:headLen] the value that a fresh lock takes, with
// no waiter's mark and no list, for the token of the random bits raw
// (tokenLen/2 bytes).
func putFreeValue(v, raw []byte) {
	hex.Encode(v[:tokenLen], raw)
	v[markAt] = markFree
}

// tokenOf returns the token of v, a lock's value.
func tokenOf(v string) string { return v[:tokenLen] }

// heldBy reports whether v is the value of a lock that token holds.
func heldBy(v, token string) bool {
	return len(v) >= headLen && tokenOf(v) == token
}

// waitMarked reports whether v is the value of a lock that a waiter marked.
func waitMarked(v string) bool {
	return len(v) >= headLen && v[markAt] == markWait
}

// lockValue returns the value of token's lock, marked by a waiter or not,
// with the list of the given handle ids when there are any (a lock that was
// re-entered: the root's id, rootID, is one of them unless it closed).
func lockValue(token string, marked bool, ids ...string) string {
	v := []byte(token)
	if marked {
		v = append(v, markWait)
	} else {
		v = append(v, markFree)
	}
	if len(ids) > 0 {
		v = append(v, listSep, idSep)
		for _, id := range ids {
			v = append(v, id...)
			v = append(v, idSep)
		}
	}
	return string(v)
}
