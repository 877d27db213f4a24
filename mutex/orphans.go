package mutex

import (
	"sync"
	"sync/atomic"
)

// An acquire attempt that its caller gave up on before the reply came (its
// context ended while Redis was paused, or the connection dropped) may still
// run: the lock is then held under a token nobody has, until its lease ends,
// and every later call of the name waits for that. So the Locker remembers
// the names of such attempts, token included, and the next fresh attempt on
// the name makes its attempt under that token: a lock the orphan took is
// then found to be the attempt's own, and adopted (acquire.lua answers a
// token that finds its own lock as the holder), with the lease it has left.
//
// One owner per name still holds: a remembered token is taken out of the
// memory by the one attempt that uses it (take), and goes back only if that
// attempt ended without a lock (put); a late reply that would release the
// orphan (a client that ignores deadlines, ctxcall) releases it only if it
// can take the token back first (claim), so a lock adopted meanwhile is
// never released behind its holder. A handle that got a remembered token
// owns it, as it owns a fresh one.
//
// What remains: an orphan's command that runs after the adopting handle
// released the lock (a server paused for longer than that) takes the lock
// again under a token nobody remembers: it holds until its lease ends, as
// before. Other Lockers (other processes) cannot adopt: they wait for the
// lease, or for the release of the Locker that adopted it.

// maxOrphans bounds the names a Locker remembers; past it, an arbitrary one
// is forgotten (its orphan, if any, lasts until its lease ends).
const maxOrphans = 1024

// orphans is a Locker's memory of the tokens of attempts with an unknown
// outcome, by name. The zero value is empty and ready.
type orphans struct {
	n  atomic.Int64 // len(m): zero on the common path, which then takes no lock
	mu sync.Mutex
	m  map[string]names
}

// take removes and returns the names of name's remembered attempt, if any.
func (o *orphans) take(name string) (names, bool) {
	if o.n.Load() == 0 {
		return names{}, false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	n, ok := o.m[name]
	if ok {
		delete(o.m, name)
		o.n.Store(int64(len(o.m)))
	}
	return n, ok
}

// put remembers n, the names of an attempt on name whose outcome is
// unknown, or that used a remembered token and got no lock. It replaces
// what was remembered for name: that token's attempt, if it ever runs,
// leaves an orphan until its lease ends.
func (o *orphans) put(name string, n names) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = make(map[string]names)
	}
	if _, ok := o.m[name]; !ok && len(o.m) >= maxOrphans {
		for k := range o.m {
			delete(o.m, k)
			break
		}
	}
	o.m[name] = n
	o.n.Store(int64(len(o.m)))
}

// claim removes name's remembered attempt if its token is token, and
// reports whether it did: the caller, a late reply of that attempt, may
// then release the orphan. If it reports false, an attempt took the token
// to adopt the orphan, or the memory forgot it: the caller leaves the lock
// alone.
func (o *orphans) claim(name, token string) bool {
	if o.n.Load() == 0 {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if n, ok := o.m[name]; ok && n.token == token {
		delete(o.m, name)
		o.n.Store(int64(len(o.m)))
		return true
	}
	return false
}
