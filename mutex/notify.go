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
// name has waiters. The maps are guarded by Locker.mu.
type subscription struct {
	ps    *redis.PubSub
	names map[string]string                 // channel -> lock name
	sems  map[string]map[string]chan string // channel -> token -> a semaphore waiter's grant
	// ready: semaphore channel -> closed once its SUBSCRIBE was sent, so
	// that a waiter that joins while another subscribes polls after it.
	ready map[string]chan struct{}
	// calls serializes SUBSCRIBE and UNSUBSCRIBE: an UNSUBSCRIBE sent after
	// Locker.mu was released must not overtake a later waiter's SUBSCRIBE.
	calls sync.Mutex
	done  chan struct{} // closed when the reader goroutine has exited
}

// channel is the Pub/Sub channel of name's releases (release.lua derives it).
func (l *Locker) channel(name string) string {
	return keyspace.Key(l.prefix, name, kindReleased)
}

// subscribe listens for releases of name for its queue's lifetime; true
// when it subscribed just now.
func (l *Locker) subscribe(ctx context.Context, name string) bool {
	s, _ := l.client.(subscriber)
	if !l.notify {
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
	// An error only costs the early wake-up: the waiter's ticker still runs.
	sub.subscribe(ctx, ps, ch, nil)
	return true
}

// subscribe subscribes ps to ch, then closes ready. The SUBSCRIBE outlives
// ctx (up to unlockTimeout): other waiters on ch count on it.
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

// unsubscribeLocked returns what must run after l.mu is released.
func (l *Locker) unsubscribeLocked(name string) func() {
	sub := l.sub
	if sub == nil {
		return func() {}
	}
	ch := l.channel(name)
	delete(sub.names, ch)
	return l.dropChannelLocked(ch)
}

func (l *Locker) openSubLocked(ctx context.Context, s subscriber) {
	sub := &subscription{ps: s.Subscribe(context.WithoutCancel(ctx)), names: map[string]string{},
		sems: map[string]map[string]chan string{}, ready: map[string]chan struct{}{}, done: make(chan struct{})}
	l.sub = sub
	go l.listen(sub)
}

// dropChannelLocked unsubscribes from ch, or closes the connection when no
// channel is left; it returns what must run after l.mu is released.
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

func (l *Locker) listen(sub *subscription) {
	defer close(sub.done)
	for msg := range sub.ps.Channel() {
		l.mu.Lock()
		if waits, ok := sub.sems[msg.Channel]; ok {
			deliverGrants(waits, msg.Payload)
		}
		if name, ok := sub.names[msg.Channel]; ok {
			l.wakeHeadLocked(name)
		}
		l.mu.Unlock()
	}
}
