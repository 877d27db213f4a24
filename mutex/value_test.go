package mutex

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
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

// A change of the layout touches value.go and value.lua only: no other Go or
// Lua file of the package names a part of it. The names are value.go's
// constants and variables (but tokenLen, a token's length, which the release
// records use too, and freeLen, for allocating a fresh value) and
// value.lua's upper-case names (layoutNames): today markAt, headLen,
// listAt, markFree, markWait, listSep, idSep, rootID, rootIDs, luaLayout
// and the like, and TOKEN_LEN, MARK_AT, LIST_AT, MARK_OFFSET, LIST_SEP,
// ID_SEP, ROOT_LIST, ROOT_ID, MARK_FREE, MARK_WAIT, WAIT_BYTE.
// value_test.go is value.go's own test.
func TestLayoutLivesInValueFiles(t *testing.T) {
	banned := layoutGoNames(t)
	for i := 0; i < len(layoutNames); i += 2 {
		banned = append(banned, layoutNames[i])
	}
	word := regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`)
	mentions := func(src string) (found []string) {
		for _, w := range word.FindAllString(src, -1) {
			if slices.Contains(banned, w) {
				found = append(found, w)
			}
		}
		return found
	}
	// The names are found where they belong: the check can see them.
	for _, own := range []string{"value.go", "value.lua"} {
		if src, err := os.ReadFile(own); err != nil || len(mentions(string(src))) == 0 {
			t.Fatalf("%s: %v, or names none of %v", own, err, banned)
		}
	}
	files, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, f := range files {
		name := f.Name()
		if ext := filepath.Ext(name); (ext != ".go" && ext != ".lua") || name == "value.go" || name == "value.lua" || name == "value_test.go" {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		if found := mentions(string(src)); len(found) > 0 {
			t.Errorf("%s names the lock value's layout, which lives in value.go and value.lua only: %v", name, found)
		}
	}
	if checked < 10 {
		t.Fatalf("checked %d files: not the package's directory?", checked)
	}
}

// layoutGoNames returns the constants and variables that value.go declares,
// but tokenLen and freeLen.
func layoutGoNames(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "value.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || (g.Tok != token.CONST && g.Tok != token.VAR) {
			continue
		}
		for _, s := range g.Specs {
			for _, n := range s.(*ast.ValueSpec).Names {
				if n.Name != "tokenLen" && n.Name != "freeLen" {
					names = append(names, n.Name)
				}
			}
		}
	}
	return names
}

// withValue gives each script the functions of value.lua that it calls,
// and no other (each costs every run a closure); none of value.lua's
// functions is lost to its cutting into blocks.
func TestScriptsDefineTheValueFunctionsTheyCall(t *testing.T) {
	if got, want := len(valueFuncs), strings.Count(valueBody, "\nlocal function "); got != want || got == 0 {
		t.Fatalf("cut %d functions from value.lua, which defines %d", got, want)
	}
	scripts := map[string]string{"acquire": acquireSrc, "release": releaseSrc, "extend": extendSrc, "pttl": pttlSrc, "unlock": unlockSrc, "held": heldSrc}
	for script, src := range scripts {
		src = luaCode(src)
		for _, f := range valueFuncs {
			defs := strings.Count(src, "local function "+f.name+"(")
			uses := len(f.call.FindAllStringIndex(src, -1)) - defs
			if defs > 1 || (defs == 1) != (uses > 0) {
				t.Errorf("%s.lua defines %s %d times and calls it %d times", script, f.name, defs, uses)
			}
		}
	}
	if !strings.Contains(unlockSrc, "local function value_root_only(") {
		t.Fatal("unlock.lua lacks value_root_only: the check above finds no call")
	}
}

// value.lua's functions read and write the values that value.go's do.
func TestValueFunctionsAgreeWithGo(t *testing.T) {
	probe := redis.NewScript(withValue(`local op, a, b = ARGV[1], ARGV[2], ARGV[3]
if op == 'new' then
  return value_new(a, b == '1')
elseif op == 'token' then
  return value_token(a)
elseif op == 'marked' then
  return value_marked(a) and 1 or 0
elseif op == 'with' then
  return value_with_handle(a, b) or false
elseif op == 'without' then
  local v, n = value_without_handle(a, b)
  return {n, v or false}
elseif op == 'root' then
  local ok, marked = value_root_only(a, b)
  return {ok and 1 or 0, marked and 1 or 0}
elseif op == 'mark' then
  redis.call('SET', KEYS[1], a)
  value_mark(KEYS[1])
  return redis.call('GET', KEYS[1])
end
redis.call('SET', KEYS[1], a)
return held(KEYS[1], b, ARGV[4]) and 1 or 0
`))
	testutil.Backends(t, func(t *testing.T, be *testutil.Backend) {
		c, key := be.Client(t), be.Prefix+"{v}:lock"
		lua := func(op string, args ...any) any {
			t.Helper()
			r, err := probe.Run(context.Background(), c, []string{key}, append([]any{op}, args...)...).Result()
			if err != nil && err != redis.Nil {
				t.Fatal(err)
			}
			return r
		}
		token, free := tok('a'), lockValue(tok('a'), false)
		for _, marked := range []bool{false, true} {
			flag := map[bool]int64{false: 0, true: 1}[marked]
			checkValue(t, lua, token, free, marked, flag)
		}
	})
}

// checkValue runs value.lua's functions, through lua, on the values of
// token's lock (free unmarked, with no list) marked or not.
func checkValue(t *testing.T, lua func(string, ...any) any, token, free string, marked bool, flag int64) {
	t.Helper()
	plain, root, two := lockValue(token, marked), lockValue(token, marked, rootID), lockValue(token, marked, rootID, "7")
	want := func(what string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("marked %v: %s = %#v, want %#v", marked, what, got, want)
		}
	}
	want("value_new", lua("new", token, flag), plain)
	for _, ids := range [][]string{nil, {rootID}, {rootID, "7"}} {
		v := lockValue(token, marked, ids...)
		want("value_token "+v, lua("token", v), token)
		want("value_marked "+v, lua("marked", v), flag)
		want("value_mark "+v, lua("mark", v), lockValue(token, true, ids...))
	}
	want("value_with_handle plain", lua("with", plain, "7"), two)
	want("value_with_handle root", lua("with", root, "7"), two)
	want("value_with_handle of an open one", lua("with", two, "7"), nil)
	want("value_with_handle of the open root", lua("with", plain, rootID), nil)
	want("value_without_handle 7", lua("without", two, "7"), []any{int64(1), root})
	want("value_without_handle root", lua("without", two, rootID), []any{int64(1), lockValue(token, marked, "7")})
	want("value_without_handle the last", lua("without", root, rootID), []any{int64(0), nil})
	want("value_without_handle plain", lua("without", plain, rootID), []any{int64(0), nil})
	want("value_root_only plain", lua("root", plain, free), []any{int64(1), flag})
	want("value_root_only root", lua("root", root, free), []any{int64(1), flag})
	want("value_root_only two", lua("root", two, free), []any{int64(0), int64(0)})
	want("value_root_only of another token", lua("root", lockValue(tok('b'), marked), free), []any{int64(0), int64(0)})
	for v, open := range map[string][]string{plain: {"", rootID}, root: {"", rootID}, two: {"", rootID, "7"}} {
		for _, h := range append(open, "8") {
			want("held "+v+" "+h, lua("held", v, token, h), map[bool]int64{false: 0, true: 1}[h != "8"])
		}
		want("held by another token "+v, lua("held", v, tok('b'), ""), int64(0))
	}
}

// The layout's helpers that only tests use.

// waitMarked reports whether v is the value of a lock that a waiter marked.
func waitMarked(v string) bool {
	return len(v) >= headLen && v[markAt] == markWait
}

// lockValue returns the value of token's lock, marked or not, with the list
// of handle ids when there are any.
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
