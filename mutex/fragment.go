package mutex

import (
	"fmt"
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
// worth making: src must return {proceed, result}. When proceed is 0, the
// attempt is not made and TryLockWith and LockWith return ErrDeclined with
// result, so a caller that can already tell from the data that it has nothing
// to write (a rate limiter's denial) neither takes the lock nor waits for it:
// one round trip. Otherwise the attempt is made and result returned as for
// NewFragment. Lock.Run returns ErrDeclined too, leaving the lock held.
func NewGate(src string) *Fragment { return newFragment(src, true) }

func newFragment(src string, gate bool) *Fragment {
	wrap := func(lockSrc, body string) string {
		var b strings.Builder
		b.WriteString("local function lock_part(KEYS, ARGV)\n")
		b.WriteString(lockSrc)
		b.WriteString("\nend\nlocal function user_part(KEYS, ARGV)\n")
		b.WriteString(src)
		b.WriteString("\nend\n")
		b.WriteString(body)
		return b.String()
	}
	// run calls the fragment into res, returns its error, and for a gate
	// returns `declined` when it declines and unwraps its result.
	run := func(keys, args int, declined string) string {
		s := fmt.Sprintf(`local res = user_part({unpack(KEYS, %d)}, {unpack(ARGV, %d)})
if type(res) == 'table' and res.err then
  return res
end
`, keys+1, args+1)
		if gate {
			s += `if type(res) ~= 'table' then
  return redis.error_reply('mutex: a gate must return {proceed, result}')
end
if res[1] == 0 then
  return ` + declined + `
end
res = res[2]
`
		}
		return s
	}
	// The fragment runs before the acquire attempt (the lock's key is not the
	// fragment's, so within one atomic script the order does not change what
	// it reads) so that a fragment that fails leaves no lock behind.
	acq := wrap(acquireSrc, run(acquireKeys, acquireArgs, "{2, 0, 0, res[2]}")+
		`local r = lock_part({KEYS[1], KEYS[2]}, {ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]})
r[4] = res
return r
`)
	// The release comes first so that a fragment that fails still leaves the
	// lock released, never stuck until its lease ends; the fragment runs only
	// if the release found the handle holding the lock.
	rel := wrap(releaseSrc, `local r = lock_part({KEYS[1], KEYS[2]}, {ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]})
if r[1] < 0 then
  return r
end
`+run(releaseKeys, releaseArgs, "{r[1], r[2], res[2]}")+`r[3] = res
return r
`)
	hld := wrap(heldSrc+"return held(KEYS[1], ARGV[1], ARGV[2])", `if not lock_part({KEYS[1]}, {ARGV[1], ARGV[2]}) then
  return {0}
end
`+run(heldKeys, heldArgs, "{2, res[2]}")+`return {1, res}
`)
	return &Fragment{gate: gate, acquire: redis.NewScript(acq), release: redis.NewScript(rel), held: redis.NewScript(hld)}
}

// Call is one run of a Fragment with its keys and arguments.
type Call struct {
	Fragment *Fragment
	Keys     []string
	Args     []any
}

func (c Call) check() error {
	if c.Fragment == nil {
		return fmt.Errorf("%w: nil Fragment", ErrInvalidCall)
	}
	return nil
}
