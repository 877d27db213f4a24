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
// name has waiters. chans is guarded by Locker.mu.
type subscription struct {
	ps    *redis.PubSub
	chans map[string]*listener // by channel
	// calls serializes SUBSCRIBE and UNSUBSCRIBE: an UNSUBSCRIBE sent after
	// Locker.mu was released must not overtake a later waiter's SUBSCRIBE.
	calls sync.Mutex
	done  chan struct{} // closed when the reader goroutine has exited
}

// A listener is what the Locker's waiters hear on one channel: a lock's
// releases or a semaphore's grants.
type listener struct {
	lock   string                 // the lock's name; "" on a semaphore's channel
	grants map[string]chan string // token -> a semaphore waiter's grant
	// ready is closed once the channel's SUBSCRIBE was sent, so that a
	// waiter that joins while another subscribes polls after it.
	ready chan struct{}
}

// channel is the Pub/Sub channel of name's releases (release.lua derives it).
func (l *Locker) channel(name string) string {
	return keyspace.Key(l.prefix, name, kindReleased)
}

// subscribe listens for releases of name for its queue's lifetime; true
// when it subscribed just now.
func (l *Locker) subscribe(ctx context.Context, name string) bool {
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
	ch := l.channel(name)
	c, _ := l.listenLocked(ctx, ch) // fresh: the queue's channel goes with it
	c.lock = name
	sub := l.sub
	l.mu.Unlock()
	// An error only costs the early wake-up: the waiter's ticker still runs.
	sub.subscribe(ctx, ch, c.ready)
	return true
}

// listenLocked returns ch's listener, opening the connection and adding
// the listener if need be; fresh: added just now, the caller subscribes.
func (l *Locker) listenLocked(ctx context.Context, ch string) (c *listener, fresh bool) {
	if l.sub == nil {
		s, _ := l.client.(subscriber)
		l.sub = &subscription{ps: s.Subscribe(context.WithoutCancel(ctx)), chans: map[string]*listener{}, done: make(chan struct{})}
		go l.listen(l.sub)
	}
	if c = l.sub.chans[ch]; c == nil {
		c = &listener{grants: map[string]chan string{}, ready: make(chan struct{})}
		l.sub.chans[ch] = c
		fresh = true
	}
	return c, fresh
}

// subscribe subscribes to ch, then closes ready. The SUBSCRIBE outlives
// ctx (up to unlockTimeout): other waiters on ch count on it.
func (sub *subscription) subscribe(ctx context.Context, ch string, ready chan struct{}) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		sub.calls.Lock()
		defer sub.calls.Unlock()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
		defer cancel()
		_ = sub.ps.Subscribe(sctx, ch)
		close(ready)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// dropChannelLocked forgets ch's listener and unsubscribes from ch, or
// closes the connection when no channel is left; it returns what must run
// after l.mu is released.
func (l *Locker) dropChannelLocked(ch string) func() {
	sub := l.sub
	delete(sub.chans, ch)
	if len(sub.chans) > 0 {
		return func() {
			sub.calls.Lock()
			defer sub.calls.Unlock()
			l.mu.Lock()
			_, back := sub.chans[ch]
			l.mu.Unlock()
			if !back { // nobody came back to it since
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
		if c := sub.chans[msg.Channel]; c != nil && c.lock != "" {
			l.wakeHeadLocked(c.lock)
		} else if c != nil {
			deliverGrants(c.grants, msg.Payload)
		}
		l.mu.Unlock()
	}
}
