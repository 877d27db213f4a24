package mutex

import (
	"context"
	"sync"

	"github.com/funnelguard/funnelguard/internal/keyspace"

	"github.com/redis/go-redis/v9"
)

// subscriber is the optional part of a Client that release notifications use.
type subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// A subscription is a Locker's one Pub/Sub connection, open only while some
// name has waiters; its goroutine wakes the head waiter of a released name.
type subscription struct {
	ps    *redis.PubSub
	names map[string]string // channel -> lock name; guarded by Locker.mu
	// sems are the semaphore waiters listening: channel -> token -> the
	// waiter's grant; guarded by Locker.mu.
	sems map[string]map[string]chan string
	// ready: semaphore channel -> closed once its SUBSCRIBE was sent, so
	// that a waiter that joins while another subscribes polls after it;
	// guarded by Locker.mu.
	ready map[string]chan struct{}
	// calls serializes the SUBSCRIBE and UNSUBSCRIBE calls: an UNSUBSCRIBE
	// of a channel nobody listened to any more, sent after Locker.mu was
	// released, must not overtake the SUBSCRIBE of a waiter that came since
	// (it checks again under calls), or that waiter hears nothing.
	calls sync.Mutex
	done  chan struct{} // closed when the reader goroutine has exited
}

// channel is the Pub/Sub channel on which releases of name are announced:
// the lock's key with "released" for "lock" (release.lua derives it so).
func (l *Locker) channel(name string) string {
	return keyspace.Key(l.prefix, name, kindReleased)
}

// canNotify reports whether waiters can hear of releases.
func (l *Locker) canNotify() bool {
	_, ok := l.client.(subscriber)
	return l.notify && ok
}

// subscribe starts listening for releases of name, for its queue's lifetime.
// It reports whether it subscribed just now.
func (l *Locker) subscribe(ctx context.Context, name string) bool {
	s, _ := l.client.(subscriber)
	if !l.canNotify() {
		return false
	}
	l.mu.Lock()
	q := l.queues[name]
	if q == nil || q.subscribed {
		l.mu.Unlock()
		return false
	}
	q.subscribed = true
	if l.sub == nil {
		l.openSubLocked(ctx, s)
	}
	ch := l.channel(name)
	l.sub.names[ch] = name
	sub := l.sub
	ps := sub.ps
	l.mu.Unlock()
	// An error (the connection closed as the last waiter left, Redis down) only
	// costs the early wake-up: the waiter's ticker still runs. A new Pub/Sub
	// connection waits for the server's greeting: bounded by ctx like any
	// call (ctxcall).
	sub.subscribe(ctx, ps, ch, nil)
	return true
}

// subscribe subscribes ps (the subscription's connection) to ch, then
// closes ready (if not nil). The SUBSCRIBE does not stop when ctx ends:
// the other waiters of the Locker on ch count on it (a waiter whose
// context ended first would leave them deaf until their next poll); it is
// bounded by unlockTimeout. The caller waits for it until ctx ends.
func (sub *subscription) subscribe(ctx context.Context, ps *redis.PubSub, ch string, ready chan struct{}) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		sub.calls.Lock()
		defer sub.calls.Unlock()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
		defer cancel()
		_ = ps.Subscribe(sctx, ch)
		if ready != nil {
			close(ready)
		}
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// unsubscribeLocked stops listening for name; it returns what must run after
// l.mu is released (network calls, waiting for the reader to exit).
func (l *Locker) unsubscribeLocked(name string) func() {
	sub := l.sub
	if sub == nil {
		return func() {}
	}
	ch := l.channel(name)
	delete(sub.names, ch)
	return l.dropChannelLocked(ch)
}

// openSubLocked opens the Locker's Pub/Sub connection and its reader.
func (l *Locker) openSubLocked(ctx context.Context, s subscriber) {
	sub := &subscription{ps: s.Subscribe(context.WithoutCancel(ctx)), names: map[string]string{},
		sems: map[string]map[string]chan string{}, ready: map[string]chan struct{}{}, done: make(chan struct{})}
	l.sub = sub
	go l.listen(sub)
}

// dropChannelLocked unsubscribes from ch, which nobody listens to any more,
// or closes the connection when no channel is left; it returns what must
// run after l.mu is released.
func (l *Locker) dropChannelLocked(ch string) func() {
	sub := l.sub
	if len(sub.names) > 0 || len(sub.sems) > 0 {
		return func() {
			sub.calls.Lock()
			defer sub.calls.Unlock()
			l.mu.Lock()
			_, lock := sub.names[ch]
			_, sem := sub.sems[ch]
			l.mu.Unlock()
			if !lock && !sem { // nobody came back to it since
				_ = sub.ps.Unsubscribe(context.Background(), ch)
			}
		}
	}
	l.sub = nil
	return func() {
		_ = sub.ps.Close()
		<-sub.done
	}
}

// listen wakes the head waiter of each name whose release is announced.
func (l *Locker) listen(sub *subscription) {
	defer close(sub.done)
	for msg := range sub.ps.Channel() {
		l.mu.Lock()
		if waits, ok := sub.sems[msg.Channel]; ok {
			deliverGrants(waits, msg.Payload)
		}
		if name, ok := sub.names[msg.Channel]; ok {
			if q := l.queues[name]; q != nil && len(q.waiters) > 0 {
				signal(q.waiters[0].wake)
			}
		}
		l.mu.Unlock()
	}
}
