package mutex

import (
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/funnelguard/funnelguard/internal/keyspace"
)

// A lock's value is one string, so that one GET reads all of it and a plain
// lock is one SET NX PX:
//
//	<token><mark>[<listSep><idSep><id><idSep>...]
//
// PROTOCOL.md ("One owner per name") says what each part means. This file
// and value.lua are the layout's one definition (TestLayoutLivesInValueFiles).
// idSep is none of Lua's pattern characters (value_without_handle counts
// them with string.gsub).
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

const rootIDs = string(idSep) + rootID + string(idSep)

// freeLen is the length of a fresh lock's value (putFreeValue).
const freeLen = headLen

// valueBody is value.lua: the layout's Lua functions.
//
//go:embed value.lua
var valueBody string

// layoutNames are value.lua's names for the layout, each followed by its
// value as Lua source, put in at init as literals. Positions are 1-based, as
// string.sub takes them; MARK_OFFSET is 0-based, for SETRANGE. No name is a
// prefix of another.
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

var luaLayout = strings.NewReplacer(layoutNames...)

// valueSrc is value.lua with the layout's values, valueFuncs its functions.
var (
	valueSrc   = luaLayout.Replace(valueBody)
	valueFuncs = luaFuncs(valueSrc)
)

// A luaFunc is one function of value.lua.
type luaFunc struct {
	name string
	src  string
	call *regexp.Regexp
}

// luaFuncs cuts value.lua into its functions: the blocks between blank
// lines that start "local function <name>(".
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

// luaComment is a Lua comment (no script has "--" in a string).
var luaComment = regexp.MustCompile(`--[^\n]*`)

func luaCode(src string) string { return luaComment.ReplaceAllString(src, "") }

// withValue returns body preceded by the functions of value.lua that it
// calls, directly or not, and no other (each one defined costs a closure).
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

// putFreeValue writes to v[:freeLen] a fresh lock's value for raw's token.
func putFreeValue(v, raw []byte) {
	hex.Encode(v[:tokenLen], raw)
	v[markAt] = markFree
}

func tokenOf[V ~string | ~[]byte](v V) V { return v[:tokenLen] }

func heldBy(v, token string) bool {
	return len(v) >= headLen && tokenOf(v) == token
}

func checkName(name string) error {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("%w: name of %d bytes: want 1 to %d", ErrInvalid, len(name), MaxNameLen)
	}
	return nil
}

// names are the keys and fresh value of one token's lock on one name, cut
// from one string.
type names struct {
	key   string // the lock: Key(name, "lock")
	fkey  string // the fencing counter, Key(name, "fence"); "" without fencing
	nkey  string // the name's release record, Key(name, "record")
	tkey  string // the token's release record, Key(name, "record:<token>")
	token string // tokenLen hex digits of random bits
	value string // the lock's value while nobody waits for it (putFreeValue)
}

func (l *Locker) names(name string) names {
	var raw [tokenLen / 2]byte
	_, _ = rand.Read(raw[:]) // crypto/rand.Read never fails (Go 1.24+)
	tag := keyspace.Tag(name)
	base := len(l.prefix) + len(tag) + 3 // <prefix>{<tag>}:
	size := base + len(kindLock) + base + len(kindRecord) + 1 + tokenLen + freeLen
	if l.fenceTTL > 0 {
		size += base + len(kindFence)
	}
	var b strings.Builder
	b.Grow(size)
	keyspace.Write(&b, l.prefix, tag, kindLock)
	keyEnd := b.Len()
	if l.fenceTTL > 0 {
		keyspace.Write(&b, l.prefix, tag, kindFence)
	}
	fenceEnd := b.Len()
	keyspace.Write(&b, l.prefix, tag, kindRecord)
	recordEnd := b.Len()
	// ":" and the token end the token's record key; the value follows.
	var tail [1 + tokenLen + freeLen]byte
	tail[0] = ':'
	putFreeValue(tail[1+tokenLen:], raw[:])
	copy(tail[1:1+tokenLen], tokenOf(tail[1+tokenLen:]))
	b.Write(tail[:])
	s := b.String()
	tokenEnd := len(s) - freeLen
	return names{
		key:   s[:keyEnd],
		fkey:  s[keyEnd:fenceEnd],
		nkey:  s[fenceEnd:recordEnd],
		tkey:  s[fenceEnd:tokenEnd],
		token: s[recordEnd+1 : tokenEnd],
		value: s[tokenEnd:],
	}
}
