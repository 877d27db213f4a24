package mutex

import (
	"crypto/sha1"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// A Fragment is a caller's Lua chunk that runs inside one of the lock's own
// scripts, atomically with it, so that a read-modify-write of data guarded by
// the lock costs no extra round trip and a write lands only while the lock is
// held:
//
//   - Locker.TryLockWith and LockWith run it with an acquire attempt and
//     return its result whether or not the lock was obtained. Use it to read.
//     If it fails (a Lua error or redis.error_reply), no lock is taken.
//   - Lock.Run runs it only while the handle holds the lock.
//   - Lock.UnlockWith runs it only if the handle still holds the lock, and
//     releases the handle in the same script. Use it to write. If it fails
//     the handle is released all the same, and its writes up to the failure
//     stay (Redis does not roll scripts back).
//
// The chunk sees its own keys and arguments as KEYS and ARGV (from 1), never
// the lock's, and its return value is the call's result (go-redis types:
// int64, string, []any, nil). Its keys must hash to the lock's cluster slot:
// build them with Locker.Key. Values are data: pass them as keys and
// arguments, never splice them into the source.
//
// A Fragment is safe for concurrent use. Create it once, at init.
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
// worth making: src must return a table whose first element, proceed, is 1
// or 0; the gate's result is the rest of the table ([]any, in order). When
// proceed is 0, the attempt is not made and TryLockWith and LockWith return
// ErrDeclined with the result, so a caller that can already tell from the
// data that it has nothing to write (a rate limiter's denial) neither takes
// the lock nor waits for it: one round trip. Otherwise the attempt is made
// and the result returned as for NewFragment. Lock.Run returns ErrDeclined
// too, leaving the lock held. (One flat table: a declined gate's reply is
// that same table, the cheapest reply Redis can make.)
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
// fragment's keys and arguments come first in KEYS and ARGV, the lock's
// last: the wrapper takes the lock's off the end of the same tables (into
// locals) and the fragment sees its own from 1, with the right lengths. No
// table is built or shifted for the fragment: a declined gate, the common
// case of a rate limiter under attack, costs little more than the
// fragment's own work.

// lockPart is the lock's script as a Lua function of KEYS and ARGV.
func lockPart(lockSrc string) string {
	return "local function lock_part(KEYS, ARGV)\n" + lockSrc + "\nend\n"
}

// userPart is the fragment as a Lua function of its KEYS and ARGV.
func userPart(src string) string {
	return "local function user_part(KEYS, ARGV)\n" + src + "\nend\n"
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

// cutLockKeys is cutTail of the lock's keys for the acquire and release
// scripts: n keys (1 or 2), and the fencing counter's, KEYS<n+1>, only when
// fencing is on (fence, the local holding the counter's TTL argument, is not
// "0").
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

// putFront writes the locals of cutTail to the first n slots of t, for the
// lock's part (which reads no further) once the fragment is done with t.
func putFront(t string, n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%[1]s[%[2]d] = %[1]s%[2]d\n", t, i)
	}
	return b.String()
}

// locals lists the locals of cutTail as a Lua table constructor.
func locals(t string, n int) string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s%d", t, i+1)
	}
	return "{" + strings.Join(names, ", ") + "}"
}

// runUser calls the fragment into res and returns its error. For a gate it
// runs declined (Lua statements that return) when the gate declines, and
// otherwise drops proceed from the table, leaving the result.
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

// reuseDeclined is the reply of a declined gate, {declinedReply, result...}:
// the gate's own table.
var reuseDeclined = fmt.Sprintf("res[1] = %d\n  return res", declinedReply)

// wrapAcquire runs the fragment before the acquire attempt (the lock's key
// is not the fragment's, so within one atomic script the order does not
// change what it reads) so that a fragment that fails or declines leaves no
// lock behind. Reply: the acquire script's, with the result appended; or
// {declinedReply, result...}.
func wrapAcquire(src string, gate bool) string {
	return userPart(src) + cutTail("ARGV", acquireArgs) + cutLockKeys(acquireKeys-1, fmt.Sprintf("ARGV%d", acquireFenceArg)) +
		runUser(gate, reuseDeclined) +
		putFront("KEYS", acquireKeys) + putFront("ARGV", acquireArgs) +
		lockPart(acquireSrc) + `local r = lock_part(KEYS, ARGV)
r[4] = res
return r
`
}

// wrapRelease releases first, so that a fragment that fails still leaves the
// lock released, never stuck until its lease ends; the fragment runs only if
// the release found the handle holding the lock, and then the release is
// recorded with its result (record.lua). Reply: the release script's, with
// the result appended; a replay of a recorded release returns the record
// and does not run the fragment again.
func wrapRelease(src string, gate bool) string {
	sum := sha1.Sum([]byte(src))
	return recordSrc + callID(fmt.Sprintf("fragment %x %t", sum, gate)) + lockPart(releaseSrc) + userPart(src) + cutTail("ARGV", releaseArgs) +
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
	return lockPart(heldSrc) + userPart(src) +
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

func (c Call) check() error {
	if c.Fragment == nil {
		return fmt.Errorf("%w: Call without a Fragment", ErrInvalid)
	}
	return nil
}
