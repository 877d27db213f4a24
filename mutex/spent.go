package mutex

import (
	"context"
	_ "embed"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// An attempt that adopts an orphan's token (orphans.go) may win the lock by
// a fresh SET NX: the orphan's command had not run yet. It may still run (a
// starved or stopped server reads it from its socket buffer late), and if
// it runs after the adopting handle released the lock, it takes the lock
// again under a token nobody holds, until its lease ends. The token cannot
// go back into the orphan memory: a new handle under it would share the
// release record of the one that released it, and a replay of that release
// would be answered for the wrong handle. So the Locker keeps such a token
// apart, as spent, for spentLeases of its lease: never handed to an
// attempt, only deleted when it holds the lock. An attempt that finds the
// lock held while the name has spent tokens sends spent.lua (a
// compare-and-delete under each spent token, which writes no record and
// publishes the release if a waiter marked the lock) and, if it deleted the
// lock, tries once more. The common path pays one atomic load, and only
// when the lock was found held.
//
// One owner per name holds: a spent token's hold has ended (its last
// handle released the lock in Redis), no handle is ever made under it
// again, so the lock deleted under it is nobody's. A token handed on
// without a round trip (hold.passOn) lives on in the next hold, which
// inherits adopted, and is spent only when that hold releases.

// spentLeases is how long, in leases of the Locker (WithTTL), a spent token
// is looked for: an orphan's command that runs later than that holds the
// lock until its lease ends. The memory is bounded as the orphans' is
// (maxOrphans names, maxTokens tokens a name, the oldest forgotten).
const spentLeases = 3

//go:embed spent.lua
var spentBody string

var spentScript = redis.NewScript(withValue(spentBody))

// spentToken is one spent token and when it is forgotten.
type spentToken struct {
	token string
	until time.Time
}

// spent is a Locker's memory of spent tokens, by name, oldest first. The
// zero value is empty and ready.
type spent struct {
	n  atomic.Int64 // len(m): zero on the common path, which then takes no lock
	mu sync.Mutex
	m  map[string][]spentToken
}

// put remembers token, spent on name, until until.
func (s *spent) put(name, token string, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := s.m[name]
	if ts == nil && len(s.m) >= maxOrphans {
		for k := range s.m {
			delete(s.m, k)
			break
		}
	}
	if len(ts) == maxTokens {
		ts = ts[1:]
	}
	s.set(name, append(ts[:len(ts):len(ts)], spentToken{token, until}))
}

// args returns name's spent tokens that are not forgotten at now, as
// spent.lua's arguments, forgetting the others.
func (s *spent) args(name string, now time.Time) []any {
	if s.n.Load() == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := slices.DeleteFunc(slices.Clone(s.m[name]), func(t spentToken) bool { return !now.Before(t.until) })
	s.set(name, ts)
	args := make([]any, len(ts))
	for i, t := range ts {
		args[i] = t.token
	}
	return args
}

// drop forgets token, whose lock spent.lua deleted.
func (s *spent) drop(name, token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.set(name, slices.DeleteFunc(slices.Clone(s.m[name]), func(t spentToken) bool { return t.token == token }))
}

// set makes ts the spent tokens of name (none: forgets it). s.mu is held.
func (s *spent) set(name string, ts []spentToken) {
	if len(ts) == 0 {
		delete(s.m, name)
	} else {
		if s.m == nil {
			s.m = make(map[string][]spentToken)
		}
		s.m[name] = ts
	}
	s.n.Store(int64(len(s.m)))
}

// spend remembers the token of h, whose last handle released the lock in
// Redis, when it came from the orphan memory.
func (single) spend(h *hold) {
	if l := h.locker; h.adopted {
		l.spent.put(h.name, h.token, time.Now().Add(spentLeases*l.ttl))
	}
}

// clearSpent deletes the lock on name if a spent token of the name holds
// it, after an attempt found it held, and reports whether it did: the
// caller then tries again. An error leaves things as they were (the
// attempt's ErrLocked stands).
func (l *Locker) clearSpent(ctx context.Context, name string) bool {
	args := l.spent.args(name, time.Now())
	if len(args) == 0 {
		return false
	}
	reply, err := l.run(ctx, spentScript, []string{l.LockKey(name)}, args, nil)
	if err != nil {
		return false
	}
	i, err := integer(reply)
	if err != nil || i < 1 || i > int64(len(args)) {
		return false
	}
	l.spent.drop(name, args[i-1].(string))
	return true
}
