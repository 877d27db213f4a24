package mutex

import (
	_ "embed"
	"encoding/hex"
	"regexp"
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
// This is the layout's one definition: this file for Go, value.lua for Lua.
// No other file builds, reads or edits a value, or knows a length or a
// position in it (TestLayoutLivesInValueFiles): Go code calls the functions
// below, and the scripts call value.lua's (withValue prepends the ones each
// uses), so a change of the layout touches these two files only.
// The marks and separators are single bytes; idSep is none of Lua's pattern
// characters (value_without_handle counts idSeps with string.gsub).
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

// freeLen is the length of the value that a fresh lock takes (putFreeValue).
const freeLen = headLen

// valueBody is value.lua: the layout's Lua functions.
//
//go:embed value.lua
var valueBody string

// layoutNames are the names that value.lua's functions use for the layout,
// each followed by its value as Lua source: luaLayout puts the values in,
// once at init, so that the numbers live here only and cost a run nothing.
// (A local holding a constant costs each run a VM instruction, ~4 ns; a
// literal is loaded where it is used.) Positions are 1-based, as string.sub
// takes them:
//
//	TOKEN_LEN    the token's length, and its last position
//	MARK_AT      the mark's position, and the length of a value without a list
//	LIST_AT      the position of the list's first ID_SEP
//	MARK_OFFSET  the mark's 0-based offset for SETRANGE, as text (redis.call
//	             formats a Lua number, at a cost)
//	MARK_FREE, MARK_WAIT, LIST_SEP, ID_SEP  the marks and separators, as text
//	WAIT_BYTE    MARK_WAIT as a number, as string.byte returns it
//	ROOT_ID, ROOT_LIST  the root handle's id, and the list of it alone
//
// No name is a prefix of another.
var layoutNames = []string{
	"TOKEN_LEN", strconv.Itoa(tokenLen),
	"MARK_AT", strconv.Itoa(markAt + 1),
	"LIST_AT", strconv.Itoa(listAt + 1),
	"MARK_OFFSET", luaText(strconv.Itoa(markAt)),
	"MARK_FREE", luaText(string(rune(markFree))),
	"MARK_WAIT", luaText(string(rune(markWait))),
	"WAIT_BYTE", strconv.Itoa(markWait),
	"LIST_SEP", luaText(string(rune(listSep))),
	"ID_SEP", luaText(string(rune(idSep))),
	"ROOT_ID", luaText(rootID),
	"ROOT_LIST", luaText(rootIDs),
}

// luaLayout writes the layout's values into value.lua.
var luaLayout = strings.NewReplacer(layoutNames...)

// valueSrc is value.lua with the layout's values in place, and valueFuncs
// its functions, in its order.
var (
	valueSrc   = luaLayout.Replace(valueBody)
	valueFuncs = luaFuncs(valueSrc)
)

// A luaFunc is one function of value.lua: its name, its source with its
// comment, and a pattern of a call of it: its name, not part of a longer
// one, and "(".
type luaFunc struct {
	name string
	src  string
	call *regexp.Regexp
}

// luaFuncs cuts src, value.lua, into its functions: the blocks between blank
// lines that define one ("local function <name>(" at a line's start). Other
// blocks (the file's comment) are left out.
func luaFuncs(src string) []luaFunc {
	var fs []luaFunc
	for _, block := range strings.Split(src, "\n\n") {
		_, def, ok := strings.Cut("\n"+block, "\nlocal function ")
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(def, "(")
		fs = append(fs, luaFunc{name: name, src: strings.TrimSpace(block) + "\n", call: regexp.MustCompile(`\b` + name + `\(`)})
	}
	return fs
}

// luaComment is a Lua comment, up to its line's end. (It would cut a string
// holding "--" too: none of the scripts has one.)
var luaComment = regexp.MustCompile(`--[^\n]*`)

// luaCode is src without its comments, where a function's name followed by
// "(" is a call or its definition.
func luaCode(src string) string { return luaComment.ReplaceAllString(src, "") }

// withValue returns body, a script that reads or writes a lock's value,
// preceded by the functions of value.lua that it calls, directly or through
// another of them, and by no other: each one defined costs every run of the
// script a closure, whether the run calls it or not (bench/README.md: ~0.2-0.3 us
// of server CPU each, measured once).
func withValue(body string) string {
	used := make([]bool, len(valueFuncs))
	callers := luaCode(body)
	// A function calls only those above it: one pass upwards finds all.
	for i := len(valueFuncs) - 1; i >= 0; i-- {
		if valueFuncs[i].call.MatchString(callers) {
			used[i] = true
			callers += luaCode(valueFuncs[i].src)
		}
	}
	var b strings.Builder
	for i, f := range valueFuncs {
		if used[i] {
			b.WriteString(f.src)
		}
	}
	b.WriteString(body)
	return b.String()
}

// putFreeValue writes to v[:freeLen] the value that a fresh lock takes, with
// no waiter's mark and no list, for the token of the random bits raw
// (tokenLen/2 bytes).
func putFreeValue(v, raw []byte) {
	hex.Encode(v[:tokenLen], raw)
	v[markAt] = markFree
}

// tokenOf returns the token of v, a lock's value (as a string, or as the
// bytes that putFreeValue wrote).
func tokenOf[V ~string | ~[]byte](v V) V { return v[:tokenLen] }

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
