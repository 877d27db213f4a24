package funnel

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// A call answered with an error takes nothing (see doc.go, "A failed call is
// not charged"): every write of an admission carries the server time from
// which Redis refuses it, a time that the server's clock reaches no later
// than the caller's deadline. A write that runs after the caller gave up is
// refused, whenever the server gets to it.
//
// The bound comes from a sample of the server's clock: the TIME a reply
// carried (server µs) and this process's monotonic clock when the reply was
// received. Redis read its clock before it sent the reply, so at the
// reply's receipt the server's clock read at least the sample; a local
// duration d later it reads at least sample + d, less the drift of the two
// clocks over d. So for a deadline D,
//
//	until = sample + (D - received) - margin(D - received)
//
// is a server time that the server's clock has passed by D: a write run
// after D finds TIME >= until and is refused.

// sampleMaxAge is the age past which a Limiter's sample is not used: a key
// with no state is then admitted through the lock (two round trips), whose
// read gives a fresh sample.
const sampleMaxAge = time.Minute

// A sample is one reading of the server's clock: offset, the server's µs
// less this process's (µs since its clock's base) when the reply came; at,
// this process's µs then.
type sample struct {
	offset, at int64
}

// margin is what until leaves for the clocks: 1 ms (µs roundings, one
// reply's flight between the server's clock and its socket) plus 1/1000 of
// the span, for two clocks that drift apart by up to 1000 ppm (NTP slews
// by at most 500).
func margin(span int64) int64 {
	return 1000 + span/1000
}

// until returns the server time (µs) from which a write for a caller whose
// deadline is deadline (local µs) is refused.
func (s sample) until(deadline int64) int64 {
	span := max(deadline-s.at, 0)
	return s.offset + s.at + span - margin(span)
}

// A serverClock is a Limiter's latest sample of the server's clock, from
// the replies of its calls: two words written without a lock (a reader may
// pair one sample's offset with another's time, which moves the margin's
// span by the time between two replies, well inside its 1 ms).
type serverClock struct {
	base   time.Time // local µs count from it (its monotonic reading)
	offset atomic.Int64
	at     atomic.Int64 // 0: no sample yet
}

// sampleEvery is how often a reply replaces the sample: the writes to one
// cache line would otherwise cost every call of every core.
const sampleEvery = int64(10 * time.Millisecond / time.Microsecond)

// local is t as µs since the clock's base, at least 1, rounded down; up is
// that rounded up (a sample taken later, a deadline earlier: both err toward
// refusing).
func (c *serverClock) local(t time.Time, up bool) int64 {
	d := t.Sub(c.base)
	us := int64(d / time.Microsecond)
	if up && d%time.Microsecond != 0 {
		us++
	}
	return max(us, 1)
}

// sampled returns the sample of a reply that carried server time now and
// was received at recv, and keeps it as the latest unless one from the last
// sampleEvery is kept that it does not contradict: their offsets differ by
// less than a margin (the server's clock stepped, or a reply was slow).
func (c *serverClock) sampled(now int64, recv time.Time) sample {
	at := c.local(recv, true)
	s := sample{offset: now - at, at: at}
	last, diff := c.at.Load(), s.offset-c.offset.Load()
	if last == 0 || at-last >= sampleEvery || diff > margin(0) || -diff > margin(0) {
		c.keep(s)
	}
	return s
}

// The deadline argument of a write: a server time (µs, > 0) or one of these.
const (
	// noDeadline: the caller has no deadline; the write is never refused.
	noDeadline int64 = 0
	// throughLock (admit.lua only): there is no sample to bound the write
	// by, so the key is not admitted in the gate but through the lock.
	throughLock int64 = -1
)

// admitDeadline is admit.lua's deadline argument for a call whose context
// has deadline d (ok false: none), sent at local time sent.
func (c *serverClock) admitDeadline(d time.Time, ok bool, sent time.Time) int64 {
	if !ok {
		return noDeadline
	}
	s, fresh := c.latest(sent)
	if !fresh {
		return throughLock
	}
	return max(s.until(c.local(d, false)), 1)
}

// keep makes s the latest sample, whatever the age of the one kept: a
// write refused before its caller's deadline showed that one wrong.
func (c *serverClock) keep(s sample) {
	c.offset.Store(s.offset)
	c.at.Store(s.at)
}

// outOfTime reports whether a call with deadline d (zero: none) has no time
// left for a write: no more than the margin of a sample taken now.
func outOfTime(d time.Time) bool {
	if d.IsZero() {
		return false
	}
	left := int64(time.Until(d) / time.Microsecond)
	return left <= margin(max(left, 0))
}

// outcome returns a call's result and error; errLate once ctx is done. A
// write is refused up to a margin before the deadline, but a call answers
// with a deadline error no earlier than its deadline (a bench or a caller
// that reads an error with ctx.Err() == nil as Redis's fails otherwise).
func outcome(ctx context.Context, res Result, err error) (Result, error) {
	if errors.Is(err, errLate) {
		<-ctx.Done() // errLate comes only to calls with a deadline
	}
	return res, err
}

// latest returns the latest sample, or false when there is none younger
// than sampleMaxAge at local time now.
func (c *serverClock) latest(now time.Time) (sample, bool) {
	at := c.at.Load()
	s := sample{offset: c.offset.Load(), at: at}
	if at == 0 || c.local(now, false)-at > int64(sampleMaxAge/time.Microsecond) {
		return sample{}, false
	}
	return s, true
}
