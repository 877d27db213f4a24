package mutex

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"reflect"
	"strconv"
	"time"

	"github.com/funnelguard/funnelguard/internal/keyspace"
)

// Defaults and limits of a Locker.
const (
	DefaultTTL           = 10 * time.Second
	DefaultRetryInterval = 50 * time.Millisecond
	DefaultPrefix        = "fg:"
	// MaxNameLen is the longest lock name accepted, in bytes.
	MaxNameLen = 1024
)

// A Locker hands out locks on names, kept in one Redis deployment (a single
// server, a failover group or a cluster). The zero value is not usable; call
// New. A Locker is safe for concurrent use and holds no goroutines or
// connections of its own: it can be dropped at any time.
type Locker struct {
	client Client
	prefix string
	ttl    time.Duration
	retry  time.Duration
	err    error // a bad argument to New, returned by every call
}

// An Option configures a Locker in New.
type Option func(*Locker)

// WithTTL sets the default lease of a lock (DefaultTTL if unset). A holder
// that neither unlocks nor extends loses the lock when the lease ends. The
// lease is kept in whole milliseconds; it must be at least one.
func WithTTL(d time.Duration) Option {
	return func(l *Locker) {
		if d < time.Millisecond {
			l.fail(fmt.Errorf("%w: %v", ErrInvalidTTL, d))
			return
		}
		l.ttl = d
	}
}

// WithRetryInterval sets the mean time between two attempts of a waiting Lock
// (DefaultRetryInterval if unset). Each wait is drawn uniformly from
// [d/2, 3d/2) so that waiters spread out, and is cut short when the holder's
// lease ends sooner.
func WithRetryInterval(d time.Duration) Option {
	return func(l *Locker) {
		if d < time.Millisecond {
			l.fail(fmt.Errorf("%w: %v", ErrInvalidRetry, d))
			return
		}
		l.retry = d
	}
}

// WithPrefix sets the prefix of the Redis keys (DefaultPrefix if unset). A
// lock on name is stored at <prefix>{<name>}:lock, with braces and '~' in the
// name escaped, so every key of one name shares a cluster slot.
func WithPrefix(prefix string) Option {
	return func(l *Locker) {
		if err := keyspace.CheckPrefix(prefix); err != nil {
			l.fail(fmt.Errorf("%w: %w", ErrInvalidPrefix, err))
			return
		}
		l.prefix = prefix
	}
}

func (l *Locker) fail(err error) {
	if l.err == nil {
		l.err = err
	}
}

// New returns a Locker that keeps its locks through client. A nil client or
// a bad option does not panic: every call of the Locker then returns the
// error (ErrNilClient, ErrInvalidTTL, ...).
func New(client Client, opts ...Option) *Locker {
	l := &Locker{client: client, prefix: DefaultPrefix, ttl: DefaultTTL, retry: DefaultRetryInterval}
	if isNil(client) {
		l.err = ErrNilClient
	}
	for _, o := range opts {
		if o != nil {
			o(l)
		}
	}
	return l
}

func isNil(c Client) bool {
	if c == nil {
		return true
	}
	v := reflect.ValueOf(c)
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Func, reflect.Slice, reflect.Chan:
		return v.IsNil()
	}
	return false
}

// A LockOption configures one acquisition.
type LockOption func(*lockConfig)

type lockConfig struct {
	ttl time.Duration
	err error
}

// Lease sets the lease of this acquisition instead of the Locker's TTL.
func Lease(d time.Duration) LockOption {
	return func(c *lockConfig) {
		if d < time.Millisecond {
			c.err = fmt.Errorf("%w: %v", ErrInvalidTTL, d)
			return
		}
		c.ttl = d
	}
}

// TryLock makes one attempt to acquire the lock on name. It returns ErrLocked
// when another owner holds it.
//
// If ctx carries ownership of name (from Lock.Context of a lock of this
// Locker), TryLock re-enters that lock instead: the hold count in Redis goes
// up by one and the returned handle must be unlocked too; it returns
// ErrNotHeld if the owning lock is gone. Without such a context, locking a
// name twice fails like any other contention, even in one goroutine: Go has
// no goroutine identity, so ownership is explicit.
func (l *Locker) TryLock(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
	lk, _, _, err := l.attempt(ctx, name, opts, nil)
	return lk, err
}

// TryLockWith is TryLock that also runs call.Fragment in the same script,
// right after the acquire attempt, and returns its result whether or not the
// lock was obtained (with ErrLocked when it was not). See Fragment.
func (l *Locker) TryLockWith(ctx context.Context, name string, call Call, opts ...LockOption) (*Lock, any, error) {
	if err := call.check(); err != nil {
		return nil, nil, err
	}
	lk, _, res, err := l.attempt(ctx, name, opts, &call)
	return lk, res, err
}

// Lock acquires the lock on name, waiting as long as ctx allows. Between
// attempts it waits a jittered retry interval, or less when the holder's lease
// ends sooner. When ctx ends first it returns an error matching both
// ErrNotObtained and ctx.Err(), without waiting for the next attempt. Redis
// errors end the wait at once. Re-entry through ctx works as in TryLock and
// never waits.
func (l *Locker) Lock(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
	var timer *time.Timer
	for {
		lk, pttl, _, err := l.attempt(ctx, name, opts, nil)
		if err == nil {
			return lk, nil
		}
		if ctx.Err() != nil {
			return nil, errors.Join(ErrNotObtained, ctx.Err())
		}
		if !errors.Is(err, ErrLocked) {
			return nil, err
		}
		wait := l.nextWait(pttl)
		if timer == nil {
			timer = time.NewTimer(wait)
			defer timer.Stop()
		} else {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return nil, errors.Join(ErrNotObtained, ctx.Err())
		case <-timer.C:
		}
	}
}

// nextWait is the pause before the next attempt: a jittered retry interval,
// or just past the end of the holder's lease when that comes sooner.
func (l *Locker) nextWait(pttl time.Duration) time.Duration {
	wait := l.retry/2 + time.Duration(mathrand.Int64N(int64(l.retry)))
	if pttl >= 0 && pttl+time.Millisecond < wait {
		wait = pttl + time.Millisecond
	}
	return wait
}

// ownerKey is the context key under which Lock.Context stores a hold.
type ownerKey struct {
	locker *Locker
	name   string
}

// attempt runs one acquire script. On contention it returns ErrLocked and the
// holder's remaining lease (negative when unknown).
func (l *Locker) attempt(ctx context.Context, name string, opts []LockOption, call *Call) (*Lock, time.Duration, any, error) {
	if l.err != nil {
		return nil, -1, nil, l.err
	}
	if name == "" || len(name) > MaxNameLen {
		return nil, -1, nil, fmt.Errorf("%w: %d bytes (want 1 to %d)", ErrInvalidName, len(name), MaxNameLen)
	}
	cfg := lockConfig{ttl: l.ttl}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if cfg.err != nil {
		return nil, -1, nil, cfg.err
	}

	h, _ := ctx.Value(ownerKey{l, name}).(*hold)
	reenter := "0"
	var id uint64
	if h != nil {
		if h.isEnded() {
			return nil, -1, nil, fmt.Errorf("%w: re-entry of %q, whose owning lock has ended", ErrNotHeld, name)
		}
		reenter, id = "1", h.nextID.Add(1)
	} else {
		h = newHold(l, name, newToken())
	}

	keys := []string{h.key}
	args := []any{h.token, strconv.FormatUint(id, 10), cfg.ttl.Milliseconds(), reenter}
	script := acquireScript
	if call != nil {
		script = call.Fragment.acquire
		keys = append(keys, call.Keys...)
		args = append(args, call.Args...)
	}
	start := time.Now()
	reply, err := script.Run(ctx, l.client, keys, args...).Result()
	if err != nil {
		return nil, -1, nil, fmt.Errorf("mutex: acquire %q: %w", name, err)
	}
	r, rest, err := ints(reply, 2)
	if err != nil {
		return nil, -1, nil, err
	}
	var res any
	if len(rest) > 0 {
		res = rest[0]
	}
	if r[0] != 1 {
		if reenter == "1" {
			h.end(ErrLockLost)
			return nil, -1, res, fmt.Errorf("%w: re-entry of %q, whose owning lock is gone from Redis", ErrNotHeld, name)
		}
		return nil, time.Duration(r[1]) * time.Millisecond, res, ErrLocked
	}
	lk := &Lock{hold: h, id: id}
	h.add(lk, start, time.Duration(r[1])*time.Millisecond)
	return lk, -1, res, nil
}

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}
