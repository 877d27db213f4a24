package mutex

import "encoding/hex"

// A lock's value is one string, so that one GET reads all of it and a plain
// lock is one SET NX PX:
//
//	<token><mark>[<listSep><idSep><id><idSep>...]
//
// The token is the owner's: 128 random bits as tokenLen lower-case hex
// digits, new for each acquisition. The mark is markWait when a waiter asked
// to hear of the release (a release then publishes), markFree when none did.
// Only once the owner re-entered come listSep and the ids of its open handles,
// each between two idSeps (":,0,2,"); without that list the root handle
// (rootID) alone is open, as with the list of it alone (rootIDs).
//
// This is the layout's one definition for Go: the constants and functions
// below.
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
