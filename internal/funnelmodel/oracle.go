package funnelmodel

import (
	"flag"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testmust"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

// Seed is -oracle.seed, the seed of the oracle tests' random schedules (0:
// a fresh one each run).
var Seed = flag.Uint64("oracle.seed", 0, "seed of the oracle tests' random schedules (0: a fresh one)")

// An Oracle is the set-up of one test: a seeded generator, a miniredis and
// a Limiter on it, and the server time of a schedule's offset 0.
type Oracle struct {
	Rng *rand.Rand
	B   *testutil.Backend
	Lim *funnel.Limiter
	T0  time.Time
}

// NewOracle seeds its generator from -oracle.seed or at random, and logs the
// seed if t fails, so that any failure can be replayed (pkg is the test's
// package as go test names it: "./funnel/").
func NewOracle(t *testing.T, pkg string) *Oracle {
	t.Helper()
	seed := *Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replay with: go test -run '^%s$' %s -oracle.seed=%d", t.Name(), pkg, seed)
		}
	})
	o := &Oracle{Rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), B: testutil.Mini(t)}
	o.Lim = testmust.Limiter(t, o.B.Client(t), funnel.WithPrefix(o.B.Prefix))
	o.T0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(o.Odd(1e12)) * time.Microsecond)
	return o
}

// At sets the server's clock to us µs after t0.
func (o *Oracle) At(us int64) {
	o.B.Mini.SetTime(o.T0.Add(time.Duration(us) * time.Microsecond))
}

// Odd returns a random odd number of µs in [1, 2*half-1].
func (o *Oracle) Odd(half int64) int64 {
	return 2*o.Rng.Int64N(max(half, 1)) + 1
}

// Rule returns a rule of Capacity 1..20, Leak 1..10 and a leak period that is
// round, or a random number of µs.
func (o *Oracle) Rule(name string) funnel.Rule {
	per := time.Duration(1+o.Rng.Int64N(10_000_000)) * time.Microsecond
	switch o.Rng.IntN(8) {
	case 0:
		per = time.Second
	case 1:
		per = 7 * time.Second
	case 2:
		per = time.Minute
	case 3:
		per = time.Hour
	case 4:
		per = 13 * time.Hour
	case 5:
		per = time.Duration(1+o.Rng.Int64N(1000)) * time.Microsecond
	}
	return funnel.Rule{Name: name, Capacity: 1 + o.Rng.Int64N(20), Leak: 1 + o.Rng.Int64N(10), Per: per}
}

// Name returns a short random rule name, some with braces and colons.
func (o *Oracle) Name() string {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789:/-_ {}"
	b := make([]byte, 1+o.Rng.IntN(10))
	for i := range b {
		b[i] = letters[o.Rng.IntN(len(letters))]
	}
	return string(b)
}

// N returns a call's units: often 1, else up to most.
func (o *Oracle) N(most int64) int64 {
	if o.Rng.IntN(2) == 0 {
		return 1
	}
	return 1 + o.Rng.Int64N(most)
}

// Gap returns a random time in µs to the next call on rule r: often none, so
// that calls pile up; else mostly odd numbers of µs, so that calls seldom
// fall on exact boundaries, around the time a unit takes to leak, and
// sometimes long enough to empty the funnel.
func (o *Oracle) Gap(r funnel.Rule) int64 {
	unit := max(r.Per.Microseconds()/r.Leak, 1)
	switch p := o.Rng.IntN(20); {
	case p < 3:
		return 0
	case p < 8:
		return o.Odd(unit / 8)
	case p < 18:
		return o.Odd(unit)
	default:
		return o.Odd(r.Capacity * unit)
	}
}
