package mutex

import (
	"regexp"
	"strings"
	"testing"
)

// The Go side of the layout reads back what it builds, and the list starts
// where the scripts look for it (LIST_AT, 1-based, is listAt+1).
func TestValueLayout(t *testing.T) {
	token := tok('a')
	for _, marked := range []bool{false, true} {
		for _, ids := range [][]string{nil, {rootID}, {rootID, "7"}} {
			v := lockValue(token, marked, ids...)
			if !heldBy(v, token) || heldBy(v, tok('b')) || tokenOf(v) != token || waitMarked(v) != marked {
				t.Fatalf("%q: heldBy, tokenOf or waitMarked disagree with lockValue(%v, %v)", v, marked, ids)
			}
			if len(ids) == 0 {
				if len(v) != headLen {
					t.Fatalf("%q: %d bytes without a list, want headLen %d", v, len(v), headLen)
				}
				continue
			}
			want := string(idSep) + strings.Join(ids, string(idSep)) + string(idSep)
			if v[listAt-1] != listSep || v[listAt:] != want {
				t.Fatalf("%q: list %q after %q, want %q after listSep", v, v[listAt:], v[listAt-1], want)
			}
		}
	}
	var free [headLen]byte
	putFreeValue(free[:], make([]byte, tokenLen/2))
	if v := string(free[:]); v != lockValue(strings.Repeat("0", tokenLen), false) {
		t.Fatalf("putFreeValue wrote %q", v)
	}
	if lockValue(token, false, rootID)[listAt:] != rootIDs || strings.ContainsRune("^$()%.[]*+-?", idSep) {
		t.Fatal("rootIDs is not the list of the root alone, or idSep is a Lua pattern character")
	}
}

// Every upper-case name in the scripts that read or write a lock's value is
// one of luaLayout's: none is left for Lua to read as a global (which a
// script reaches only on the path that uses it, and Redis refuses).
func TestScriptsUseOnlyLayoutNames(t *testing.T) {
	name := regexp.MustCompile(`\b[A-Z][A-Z0-9]*_[A-Z0-9_]*\b`)
	for _, src := range []string{acquireSrc, releaseSrc, extendSrc, pttlSrc, unlockSrc, valueSrc} {
		if left := name.FindAllString(src, -1); len(left) > 0 {
			t.Fatalf("names left in a script: %v", left)
		}
	}
}
