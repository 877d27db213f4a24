package mutex

import (
	"encoding/hex"
	"strconv"
	"strings"
)

// A lock's value is one string, so that one GET reads all of it and a plain
// lock is one SET NX PX:
//
//	<token><mark>[<listSep><idSep><id><idSep>...]
//
// The token is the owner's: tokenLen lower-case hex digits of random bits
// (128), new for each acquisition. The mark is markWait when a waiter found
// the lock held and waits (a release then publishes, and a chain of local
// hand-overs yields to it), markFree when none did.
// Only once the owner re-entered come listSep and the ids of its open handles,
// each between two idSeps (":,0,2,"); without that list the root handle
// (rootID) alone is open, as with the list of it alone (rootIDs).
//
// This is the layout's one definition: the constants and functions below for
// Go, and for Lua the names of luaLayout, which every script that reads or
// writes a lock's value uses and which take these constants' values at init,
// and value.lua's held over them. A script builds a value as its token
// followed by its mark: no script knows a length or a position but these.
// The marks and separators are single bytes; idSep is none of Lua's pattern
// characters (release.lua counts idSeps with string.gsub).
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

// luaLayout writes the layout into the Lua of the scripts that read or write
// a lock's value: each of these names in their source is replaced, once at
// init, by its value as a Lua literal, so that the numbers live here only
// and cost a run nothing. (A local holding a constant costs each run a VM
// instruction, ~4 ns, and one defined at the top runs whether the path uses
// it or not; a literal is loaded where it is used. A function costs each run
// a closure, ~40 ns: value.lua has only held, which the scripts that act
// only for a holder call, and the others edit a value inline.) Positions are
// 1-based, as string.sub takes them:
//
//	TOKEN_LEN    the token's length, and its last position
//	MARK_AT      the mark's position, and the length of a value without a list
//	LIST_AT      the position of the list's first ID_SEP
//	MARK_OFFSET  the mark's 0-based offset for SETRANGE, as text (redis.call
//	             formats a Lua number, at a cost)
//	MARK_FREE, MARK_WAIT, LIST_SEP, ID_SEP  the marks and separators, as text
//	WAIT_BYTE    MARK_WAIT as a number, as string.byte returns it
//	ROOT_ID, ROOT_LIST  the root handle's id, and the list of it alone
//	UNLESS_MARKED, YIELDED  release.lua's hand-over argument's prefix and
//	             reply (release.go's unlessMarked and yielded), as text
//
// No name is a prefix of another.
var luaLayout = strings.NewReplacer(
	"TOKEN_LEN", strconv.Itoa(tokenLen),
	"MARK_AT", strconv.Itoa(markAt+1),
	"LIST_AT", strconv.Itoa(listAt+1),
	"MARK_OFFSET", luaText(strconv.Itoa(markAt)),
	"MARK_FREE", luaText(string(rune(markFree))),
	"MARK_WAIT", luaText(string(rune(markWait))),
	"WAIT_BYTE", strconv.Itoa(markWait),
	"LIST_SEP", luaText(string(rune(listSep))),
	"ID_SEP", luaText(string(rune(idSep))),
	"ROOT_ID", luaText(rootID),
	"ROOT_LIST", luaText(rootIDs),
	"UNLESS_MARKED", luaText(unlessMarked),
	"YIELDED", luaText(yielded),
)

// luaText is s, which has no quote or backslash, as a Lua string literal.
func luaText(s string) string { return "'" + s + "'" }

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
