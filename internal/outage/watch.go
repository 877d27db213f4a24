package outage

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Times of a Watch.
const (
	// Retry is the least time between two probes made to admit calls while
	// the server refuses: the calls in between fail at once, and a server
	// back on its port is found within Retry of a call.
	Retry = 20 * time.Millisecond
	// Every is how often a running call checks for a refusal; a probe that
	// began less than Every ago answers for every call.
	Every = 50 * time.Millisecond
	// Detour is how long, after a probe found the server back from
	// refusing, calls are told to go to another client (Detouring).
	// go-redis's pools open a dial breaker after PoolSize failed dials (one
	// outage's first burst can make them: the commands in flight at a kill
	// retry inside go-redis, each a failed dial, before anything outside it
	// hears of the outage), and then refuse every new connection until their
	// probe, once a second, connects: up to a second after the server is
	// back. The detour outlasts that second.
	Detour = 1100 * time.Millisecond
)

// A Dial connects to the watched server.
type Dial func(ctx context.Context) (net.Conn, error)

// A Watch tells whether the server refuses connections now. It is safe for
// concurrent use. A nil *Watch watches nothing: Run only bounds the call.
type Watch struct {
	dial  Dial
	bound time.Duration // a probe's time limit
	down  atomic.Bool   // the last thing seen was a refusal
	ups   atomic.Uint64 // counts the times down was cleared
	// detour is when the detour that began when down was last cleared ends
	// (Unix ns; 0: none yet).
	detour atomic.Int64
	opts   *redis.Options // the client's, for Spare; nil for New
	spare  struct {
		once   sync.Once
		client *redis.Client
	}

	mu     sync.Mutex
	seen   time.Time // when the last probe began, or a call last saw a refusal
	err    error     // the last refusal, while down
	flight *probe    // the probe under way, or nil
}

// New returns a Watch that probes with dial, each probe bounded by bound
// (and by the dialer's own time-outs).
func New(dial Dial, bound time.Duration) *Watch {
	return &Watch{dial: dial, bound: bound}
}

// For returns a Watch of client when it is a *redis.Client (anything with
// its Options), probing with the client's own dialer, network and address,
// so that custom dialers, TLS and test dialers agree with the client. It
// returns nil for other clients (a cluster, a ring): they are not watched.
func For(client any, bound time.Duration) *Watch {
	dial := DialOf(client)
	if dial == nil {
		return nil
	}
	w := New(dial, bound)
	w.opts = client.(interface{ Options() *redis.Options }).Options()
	return w
}

// Down reports whether the last thing w saw was a refusal.
func (w *Watch) Down() bool { return w != nil && w.down.Load() }

// admit lets a call go ahead, returning the count of ups it began in, or
// the refusal that ends it at once. While the server refused, one call
// every Retry probes (and waits for the probe, bounded by ctx); the others
// fail at once.
func (w *Watch) admit(ctx context.Context) (uint64, error) {
	ups := w.ups.Load()
	if !w.down.Load() {
		return ups, nil
	}
	w.mu.Lock()
	if w.flight != nil || time.Since(w.seen) < Retry {
		err := w.err
		w.mu.Unlock()
		return 0, refused(err)
	}
	p := w.start(ctx)
	w.mu.Unlock()
	if err, ok := p.wait(ctx); !ok {
		return 0, ctx.Err()
	} else if err != nil {
		return 0, err
	}
	if w.down.Load() { // the probe neither connected nor was refused: not back
		w.mu.Lock()
		err := w.err
		w.mu.Unlock()
		return 0, refused(err)
	}
	return w.ups.Load(), nil
}

// saw records a refusal that a call begun in ups got: w is down, unless
// the server was seen back since the call began.
func (w *Watch) saw(err error, ups uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ups.Load() != ups {
		return
	}
	w.err, w.seen = err, time.Now()
	w.down.Store(true)
}
