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
//   - Locker.TryLockWith runs it with an acquire attempt and returns its
//     result whether or not the lock was obtained. Use it to read. If it
//     fails (a Lua error or redis.error_reply), no lock is taken.
//   - Lock.UnlockWith runs it only if this handle still holds the lock, and
//     releases the handle in the same script. Use it to write. If it fails
//     the handle is released all the same, and its writes up to the failure
//     stay (Redis does not roll scripts back).
//
// The chunk sees its own keys and arguments as KEYS and ARGV (from 1), never
// the lock's, and its return value is the call's result (go-redis types:
// int64, string, []any, nil). Its keys must hash to the lock's cluster slot:
// build them from the same name with the same {hash tag}. Values are data:
// pass them as keys and arguments, never splice them into the source.
//
// A Fragment is safe for concurrent use. Create it once, at init.
type Fragment struct {
	acquire *redis.Script
	release *redis.Script
}

// NewFragment wraps the Lua source src for use with TryLockWith and
// UnlockWith.
func NewFragment(src string) *Fragment {
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
	// The fragment runs before the acquire attempt (the lock's key is not the
	// fragment's, so within one atomic script the order does not change what
	// it reads) so that a fragment that fails leaves no lock behind.
	acq := wrap(acquireSrc, fmt.Sprintf(`local res = user_part({unpack(KEYS, %d)}, {unpack(ARGV, %d)})
if type(res) == 'table' and res.err then
  return res
end
local r = lock_part({KEYS[1], KEYS[2]}, {ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]})
r[4] = res
return r
`, acquireKeys+1, acquireArgs+1))
	// The release comes first so that a fragment that fails still leaves the
	// lock released, never stuck until its lease ends; the fragment runs only
	// if the release found the handle holding the lock.
	rel := wrap(releaseSrc, fmt.Sprintf(`local r = lock_part({KEYS[1], KEYS[2]}, {ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]})
if r[1] < 0 then
  return r
end
local res = user_part({unpack(KEYS, %d)}, {unpack(ARGV, %d)})
if type(res) == 'table' and res.err then
  return res
end
r[3] = res
return r
`, releaseKeys+1, releaseArgs+1))
	return &Fragment{acquire: redis.NewScript(acq), release: redis.NewScript(rel)}
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
