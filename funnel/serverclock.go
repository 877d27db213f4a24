package funnel

import (
	"sync/atomic"
	"time"
)

// sampleMaxAge is the age past which a sample is not used: the call goes
// through the lock, whose read gives a fresh one.
const sampleMaxAge = time.Minute

// A sample is one reading of the server's clock: offset, the server's µs
// less this process's when the reply came; at, this process's µs then.
type sample struct {
	offset, at int64
}

// margin is what until leaves for the clocks: 1 ms plus 1000 ppm of the
// span (NTP slews by at most 500).
func margin(span int64) int64 {
	return 1000 + span/1000
}

// until returns the server time (µs) from which the write of an admission
// whose caller's deadline is deadline (local µs) is refused: one the
// server's clock reaches by then, by s and the margin (DESIGN.md).
func (s sample) until(deadline int64) int64 {
	span := max(deadline-s.at, 0)
	return s.offset + s.at + span - margin(span)
}

// A serverClock is a Limiter's latest sample, written without a lock: a
// reader may pair two samples' halves, well inside the margin.
type serverClock struct {
	base   time.Time // local µs count from it (its monotonic reading)
	offset atomic.Int64
	at     atomic.Int64 // 0: no sample yet
}

// sampleEvery is how often a reply replaces the sample (the writes to one
// cache line cost every core).
const sampleEvery = int64(10 * time.Millisecond / time.Microsecond)

// local is t as µs since the clock's base, at least 1, rounded down, or up
// (both err toward refusing).
func (c *serverClock) local(t time.Time, up bool) int64 {
	d := t.Sub(c.base)
	if up {
		d += time.Microsecond - 1
	}
	return max(int64(d/time.Microsecond), 1)
}

// sampled returns the sample of a reply that carried server time now and
// came at recv, and keeps it unless one from the last sampleEvery is kept
// whose offset is within a margin of it (none kept is offset 0, a server
// clock's only at the Unix epoch).
func (c *serverClock) sampled(now int64, recv time.Time) sample {
	at := c.local(recv, true)
	s := sample{offset: now - at, at: at}
	diff := s.offset - c.offset.Load()
	if at-c.at.Load() >= sampleEvery || max(diff, -diff) > margin(0) {
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

// keep makes s the latest sample: a write refused early showed the kept one wrong.
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

// latest returns the latest sample; false if none is younger than sampleMaxAge.
func (c *serverClock) latest(now time.Time) (sample, bool) {
	at := c.at.Load()
	s := sample{offset: c.offset.Load(), at: at}
	if at == 0 || c.local(now, false)-at > int64(sampleMaxAge/time.Microsecond) {
		return sample{}, false
	}
	return s, true
}
