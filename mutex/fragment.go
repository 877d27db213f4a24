package mutex

import (
	"crypto/sha1"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// A Fragment is a caller's Lua chunk that runs inside one of the lock's own
// scripts, atomically with it: read with TryLockWith or LockWith (a failing
// fragment takes no lock), write with UnlockWith (a failing fragment still
// releases, and its writes up to the failure stay), or use Run while held.
//
// The chunk sees its own keys and arguments as KEYS and ARGV, and its return
// value is the call's result. Its keys must be in the lock's cluster slot
// (Locker.Key); pass values as Args, never in the source. A Fragment is safe
// for concurrent use; create it once.
type Fragment struct {
	gate    bool
	acquire *redis.Script
	release *redis.Script
	held    *redis.Script
}

// NewFragment wraps the Lua source src for use with TryLockWith, LockWith,
// Run and UnlockWith.
func NewFragment(src string) *Fragment { return newFragment(src, false) }

// NewGate wraps a read fragment that decides whether the acquire attempt is
// worth making: src returns {proceed, result...}. With proceed 0 no attempt
// is made and the call returns ErrDeclined with the result (the rest of the
// table); otherwise it runs as NewFragment's.
func NewGate(src string) *Fragment { return newFragment(src, true) }

func newFragment(src string, gate bool) *Fragment {
	return &Fragment{
		gate:    gate,
		acquire: redis.NewScript(wrapAcquire(src, gate)),
		release: redis.NewScript(wrapRelease(src, gate)),
		held:    redis.NewScript(wrapHeld(src, gate)),
	}
}

// The wrappers below run a fragment inside one of the lock's scripts. The
// lock's keys and arguments come last in KEYS and ARGV and are cut into
// locals, so no table is built or shifted for the fragment.

// part wraps src as the Lua function name(KEYS, ARGV): lock_part, the
// lock's script, or user_part, the fragment.
func part(name, src string) string {
	return "local function " + name + "(KEYS, ARGV)\n" + src + "\nend\n"
}

// cutTail moves the last n elements of the Lua table t into locals
// <t>1..<t>n, in order, and removes them from t.
func cutTail(t string, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "local n_%s = #%s\n", t, t)
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "local %[1]s%[2]d = %[1]s[n_%[1]s - %[3]d]\n", t, i, n-i)
	}
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%[1]s[n_%[1]s - %[2]d] = nil\n", t, n-i)
	}
	return b.String()
}

// cutLockKeys is cutTail of n lock keys, and of the fencing counter's.
func cutLockKeys(n int, fence string) string {
	var b strings.Builder
	b.WriteString("local n_KEYS = #KEYS\n")
	b.WriteString("local " + strings.TrimSuffix(strings.TrimPrefix(locals("KEYS", n+1), "{"), "}") + "\n")
	b.WriteString("local lock_keys = " + strconv.Itoa(n) + "\n")
	b.WriteString("if " + fence + " ~= '0' then\n  lock_keys = " + strconv.Itoa(n+1) + "\nend\n")
	for i := 1; i <= n+1; i++ {
		fmt.Fprintf(&b, "if lock_keys >= %[1]d then\n  KEYS%[1]d = KEYS[n_KEYS - lock_keys + %[1]d]\nend\n", i)
	}
	b.WriteString("for i = n_KEYS - lock_keys + 1, n_KEYS do\n  KEYS[i] = nil\nend\n")
	return b.String()
}

// putFront writes cutTail's locals back to the first n slots of t.
func putFront(t string, n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%[1]s[%[2]d] = %[1]s%[2]d\n", t, i)
	}
	return b.String()
}

func locals(t string, n int) string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s%d", t, i+1)
	}
	return "{" + strings.Join(names, ", ") + "}"
}

// runUser calls the fragment into res, returning its error; for a gate it
// runs declined when it declines, else drops proceed.
func runUser(gate bool, declined string) string {
	s := `local res = user_part(KEYS, ARGV)
if type(res) == 'table' and res.err then
  return res
end
`
	if gate {
		s += `if type(res) ~= 'table' then
  return redis.error_reply('mutex: a gate must return {proceed, result...}')
end
if res[1] == 0 then
  ` + declined + `
end
table.remove(res, 1)
`
	}
	return s
}

// reuseDeclined replies with the gate's own table, {declinedReply, result...}.
var reuseDeclined = fmt.Sprintf("res[1] = %d\n  return res", declinedReply)

// wrapAcquire runs the fragment before the attempt, so that one that fails
// or declines leaves no lock. Reply: the acquire script's with the result,
// or {declinedReply, result...}.
func wrapAcquire(src string, gate bool) string {
	return part("user_part", src) + cutTail("ARGV", acquireArgs) + cutLockKeys(acquireKeys-1, fmt.Sprintf("ARGV%d", acquireFenceArg)) +
		runUser(gate, reuseDeclined) +
		putFront("KEYS", acquireKeys) + putFront("ARGV", acquireArgs) +
		part("lock_part", acquireSrc) + `local r = lock_part(KEYS, ARGV)
r[4] = res
return r
`
}

// wrapRelease releases first, so that a failing fragment still leaves the
// lock released; the fragment runs only if the handle held the lock, and the
// record keeps its result. A replay returns the record and does not run it.
func wrapRelease(src string, gate bool) string {
	sum := sha1.Sum([]byte(src))
	// release_call, the digest the record keeps, is computed before KEYS
	// or ARGV change.
	callID := "local release_call = call_id(" + strconv.Quote(fmt.Sprintf("fragment %x %t", sum, gate)) + ")\n"
	return recordSrc + callID + part("lock_part", releaseSrc) + part("user_part", src) + cutTail("ARGV", releaseArgs) +
		cutLockKeys(releaseKeys-1, fmt.Sprintf("ARGV%d", releaseFenceArg)) +
		"local r = lock_part(" + locals("KEYS", releaseKeys) + ", " + locals("ARGV", releaseArgs) + `)
if r[1] < 0 or r[4] then
  return r
end
` + runUser(gate, "table.remove(res, 1)\n  record(KEYS2, KEYS3, ARGV6, ARGV7, ARGV8, ARGV1, release_call, r[1], r[2], res)\n  return {r[1], r[2], res}") +
		`record(KEYS2, KEYS3, ARGV6, ARGV7, ARGV8, ARGV1, release_call, r[1], r[2], res)
r[3] = res
return r
`
}

// wrapHeld runs the fragment only while the handle holds the lock. Reply:
// {1, result}, {0} when not held, or {declinedReply, result...}.
func wrapHeld(src string, gate bool) string {
	return part("lock_part", heldSrc) + part("user_part", src) +
		cutTail("KEYS", heldKeys) + cutTail("ARGV", heldArgs) +
		"if not lock_part(" + locals("KEYS", heldKeys) + ", " + locals("ARGV", heldArgs) + `) then
  return {0}
end
` + runUser(gate, reuseDeclined) + `return {1, res}
`
}

// Call is one run of a Fragment with its keys and arguments.
type Call struct {
	Fragment *Fragment
	Keys     []string
	Args     []any
}

func acquireOf(call *Call) *redis.Script {
	if call == nil {
		return acquireScript
	}
	return call.Fragment.acquire
}

// check refuses a Call without a Fragment, then a Fragment dep cannot run.
func (c Call) check(dep deployment) error {
	if c.Fragment == nil {
		return fmt.Errorf("%w: Call without a Fragment", ErrInvalid)
	}
	return dep.unsupported("a Fragment")
}
