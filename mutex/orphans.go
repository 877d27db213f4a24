package mutex

import (
	"sync"
	"sync/atomic"
)

// An acquire attempt that its caller gave up on before the reply came (its
// context ended while Redis was paused, or the connection dropped) may still
// run: the lock is then held under a token nobody has, until its lease ends,
// and every later call of the name waits for that. So does a release that
// handed the lock to a waiting goroutine through Redis, under a fresh token
// for it, when its reply is lost: the waiter is told it got nothing. So the
// Locker remembers such tokens, by name, and its next fresh attempts on the
// name are made under them, one token each, oldest first: a lock an orphan
// took is then found to be the attempt's own, and adopted (acquire.lua
// answers a token that finds its own lock as the holder), with the lease it
// has left. An attempt that finds the lock another's puts its token back at
// the end, so that overlapping attempts of one name try every token in turn.
//
// One owner per name still holds: a remembered token is taken out of the
// memory by the one attempt that uses it (take), and goes back only if that
// attempt ended without a lock (put); a late reply that would release the
// orphan (a client that ignores deadlines, ctxcall; a batched command), and
// the repeat of a release that handed the lock over, act on its lock only if
// they can take the token back first (claim), so a lock adopted meanwhile
// is never released or handed on behind its holder. A handle that got a
// remembered token owns it, as it owns a fresh one.
//
// An orphan's command that runs only after the adopting handle released
// the lock (a starved or stopped server read it late) takes the lock again
// under the adopted token: the Locker keeps that token as spent, and its
// next attempt that finds the lock held under it deletes it (spent.go).
// Other Lockers (other processes) cannot adopt or delete: they wait for the
// lease, or for the release of the Locker that adopted it.

// maxOrphans bounds the names a Locker remembers, and maxTokens the tokens
// it remembers for one name (attempts of one name may overlap: a batch's
// leader polling while the next tries); past either, the oldest is
// forgotten (its orphan, if any, lasts until its lease ends).
const (
	maxOrphans = 1024
	maxTokens  = 4
)

// orphans is a Locker's memory of the tokens of attempts with an unknown
// outcome, by name, oldest first. The zero value is empty and ready.
type orphans struct {
	n  atomic.Int64 // len(m): zero on the common path, which then takes no lock
	mu sync.Mutex
	m  map[string][]names
}

// take removes and returns the oldest remembered attempt on name, if any:
// attempts that find the lock another's put their token back at the end, so
// the next attempts try the others in turn.
func (o *orphans) take(name string) (names, bool) {
	if o.n.Load() == 0 {
		return names{}, false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	ns := o.m[name]
	if len(ns) == 0 {
		return names{}, false
	}
	n := ns[0]
	o.set(name, ns[1:])
	return n, true
}

// put remembers n, the names of an attempt on name whose outcome is
// unknown, or that used a remembered token and got no lock.
func (o *orphans) put(name string, n names) {
	o.mu.Lock()
	defer o.mu.Unlock()
	ns := o.m[name]
	if ns == nil && len(o.m) >= maxOrphans {
		for k := range o.m {
			delete(o.m, k)
			break
		}
	}
	for _, x := range ns {
		if x.token == n.token {
			return
		}
	}
	if len(ns) == maxTokens {
		ns = ns[1:]
	}
	o.set(name, append(ns[:len(ns):len(ns)], n))
}

// claim removes token from name's remembered attempts, and reports whether
// it was there: the caller, a late reply of that attempt (or the repeat of
// a release that handed the lock to it), may then act on the lock under it.
// If it reports false, an attempt took the token to adopt the orphan, or the
// memory forgot it: the caller leaves the lock alone.
func (o *orphans) claim(name, token string) bool {
	if o.n.Load() == 0 {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	ns := o.m[name]
	for i, x := range ns {
		if x.token == token {
			o.set(name, append(ns[:i:i], ns[i+1:]...))
			return true
		}
	}
	return false
}

// set makes ns the remembered attempts of name (none: forgets it). o.mu is
// held.
func (o *orphans) set(name string, ns []names) {
	if len(ns) == 0 {
		delete(o.m, name)
	} else {
		if o.m == nil {
			o.m = make(map[string][]names)
		}
		o.m[name] = ns
	}
	o.n.Store(int64(len(o.m)))
}
