package funnel

import (
	"math"
	"math/bits"
	"time"
)

// maxWholeSeconds is the longest Duration of whole seconds.
const maxWholeSeconds = time.Duration(math.MaxInt64 / int64(time.Second) * int64(time.Second))

// Quota says what r means as "q units per w", the quota of a
// RateLimit-Policy item: r never admits more than q units in any window of
// length w, and some schedule of calls gets q through in one. A Window(n,
// w) is n per w; a calendar rule's w is its day or month at at. A funnel's
// w is its Per rounded up to whole seconds, and q a burst of Capacity plus
// what leaks within w-1µs: Capacity + ⌊Leak*(w-1µs)/Per⌋, exact and at most
// math.MaxInt64. So AtMost(3, 1500ms) is 4 per 2s. An invalid rule has no
// quota: 0, 0.
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
	per := int64(r.Per / time.Microsecond)
	w = min(micros(ceilDiv(per, 1e6)*1e6), maxWholeSeconds)
	// The quotient of Leak*(w-1µs) by per fits 64 bits when its high word
	// is below per.
	hi, lo := bits.Mul64(uint64(r.Leak), uint64(w/time.Microsecond)-1)
	if hi >= uint64(per) {
		return math.MaxInt64, w
	}
	more, _ := bits.Div64(hi, lo, uint64(per))
	return satAdd(r.Capacity, int64(min(more, math.MaxInt64))), w
}
