package funnel

import (
	_ "embed"
	"fmt"
	"time"

	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// A Penalty puts a key that keeps being denied in a box, against brute
// force: once its rules have denied it Denials times within Within, every
// call for it is denied for For, whatever the rules say, with Rule
// PenaltyRule. Redis counts and boxes in the denial's one round trip, on
// its clock; denials from the deny cache are not counted.
type Penalty struct {
	// Denials is how many denials within Within put the key in the box: at
	// least 1.
	Denials int64
	// Within is the window the denials are counted in, from the first: at
	// least a millisecond.
	Within time.Duration
	// For is how long the box lasts. At least a millisecond.
	For time.Duration
}

// PenaltyRule is the Rule a denial by the penalty box reports.
const PenaltyRule = "penalty"

const maxPenalty = 365 * 24 * time.Hour

var (
	//go:embed penalty.lua
	penaltySrc string
	// The penalty box's gate for Allow, and its script for Peek.
	penaltyGate = mutex.NewGate(readStateFunc + penaltySrc)
	penaltyPeek = redis.NewScript(readStateFunc + penaltySrc)
)

// WithPenalty puts keys that keep being denied in a box (see Penalty).
// Every admission then takes the lock (WithUniformCost). A bad Penalty is
// an error matching ErrInvalidOption.
func WithPenalty(p Penalty) Option {
	return func(lim *Limiter) error {
		if p.Denials < 1 || min(p.Within, p.For) < time.Millisecond || max(p.Within, p.For) > maxPenalty {
			return fmt.Errorf("%w: penalty of %d denials within %v, for %v: want at least 1, within and for 1 ms to a year", ErrInvalidOption, p.Denials, p.Within, p.For)
		}
		lim.penalty = []any{p.Denials, p.Within.Microseconds(), p.For.Microseconds()}
		lim.uniform = true // admit.lua does not look at the box
		return nil
	}
}

// penalized returns penalty.lua's arguments: count is "1" for Allow, "0"
// for Peek.
func (c call) penalized(box []any, count string) []any {
	args := make([]any, 0, len(c.set.ids)+4)
	args = append(args, c.set.ids...)
	args = append(args, box...)
	return append(args, count)
}

// boxed is the Result of a call boxed until till, at server time now.
func boxed(d decision, rules []rule, now, till int64) Result {
	res := d.result(rules)
	res.Allowed, res.Rule, res.Remaining = false, PenaltyRule, 0
	res.RetryAfter = micros(max(till-now, 1))
	return res
}
