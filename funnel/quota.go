package funnel

import (
	"math"
	"math/bits"
	"time"
)

// maxWholeSeconds is the longest Duration of whole seconds.
const maxWholeSeconds = time.Duration(math.MaxInt64 / int64(time.Second) * int64(time.Second))

// Quota says what r means as "q units per w", the quota of a
// RateLimit-Policy item (draft-ietf-httpapi-ratelimit-headers): r never
// admits more than q units in any window of length w, and some schedule of
// calls gets q through in one.
//
// A Window(n, w) is q = n per w. A funnel's w is its Per rounded up to whole
// seconds, and q the most it admits in any window of that length: a full
// burst of Capacity, then what leaks back within the window,
// Capacity + ⌊Leak*(w-1µs)/Per⌋, since the server's clock counts whole
// microseconds and the units of a window of w are taken at most w-1µs
// apart. That is the bound in continuous time, Capacity + ⌈w*Leak/Per⌉ - 1,
// unless w*Leak - k*Per is 1 to Leak-1 for some whole k (w and Per in µs),
// as for a funnel that leaks more than one unit per microsecond: then q is
// below it, by less than Leak. So AtMost(n, d) is n per d
// when d is whole seconds (AtMost(3, 1500ms) is 4 per 2s), and a funnel of
// Capacity 10 leaking 10 per second is 19 per second: 10 at once, then one
// every 100ms.
//
// q is computed exactly; one that would pass math.MaxInt64 is
// math.MaxInt64, and a Per within a second of the largest Duration gives
// the largest whole-second Duration as w (and its q). at is the time the
// quota is asked for (time.Now() for a response): a calendar rule's window
// is the length of its day or month at at (a day of 23 or 25 hours across a
// clock change); a funnel and a Window ignore it.
// An invalid rule (one Validate refuses) has no quota: 0, 0.
func (r Rule) Quota(at time.Time) (q int64, w time.Duration) {
	if r.invalid() != "" {
		return 0, 0
	}
	switch r.kind {
	case kindWindow:
		return r.Capacity, r.Per
	case kindDay, kindMonth:
		start, end := r.compileCalendar().cal.period(at.UnixMicro())
		return r.Capacity, micros(end - start)
	}
	per := uint64(r.Per / time.Microsecond)
	if hi, full := bits.Mul64(uint64(r.Capacity), per); hi != 0 || full > maxScaled {
		return 0, 0 // compile refuses it
	}
	w = maxWholeSeconds
	if r.Per <= maxWholeSeconds {
		w = r.Per.Truncate(time.Second)
		if w < r.Per {
			w += time.Second
		}
	}
	// Leak*(w-1µs) < 2^61 * 2^63 = 2^124, divided by per: the quotient
	// fits in 64 bits when its high word is below per.
	hi, lo := bits.Mul64(uint64(r.Leak), uint64(w/time.Microsecond)-1)
	if hi >= per {
		return math.MaxInt64, w
	}
	more, _ := bits.Div64(hi, lo, per)
	if more > math.MaxInt64 {
		return math.MaxInt64, w
	}
	return satAdd(r.Capacity, int64(more)), w
}
