package funnel

import (
	_ "embed"
	"fmt"
	"time"

	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// A Penalty puts a key that keeps being denied in a box: once its rules
// have denied it Denials times within Within, every call for it is denied
// for For, whatever the rules say, and without consulting them. It is the
// answer to brute force: a client that keeps hammering a key it has used up
// (guessing codes, retrying sends) is shut out for a while, instead of
// getting a call through each time a unit leaks back.
//
// Counting and boxing happen in Redis, in the one round trip of the denial
// (the gate script, penalty.lua), on the server's clock; the box ends at a
// server time, reported as the Result's RetryAfter, with Rule PenaltyRule.
// Denials answered from the local deny cache (WithDenyCache) reach no
// server and are not counted: with the cache on, a client is counted once
// per gate time at most.
type Penalty struct {
	// Denials is how many denials by the rules put the key in the box: the
	// Denials-th within Within does. At least 1.
	Denials int64
	// Within is the window the denials are counted in: the count restarts
	// when it has passed since the first of them. At least a millisecond.
	Within time.Duration
	// For is how long the box lasts. At least a millisecond.
	For time.Duration
}

// PenaltyRule is the Rule a denial by the penalty box reports.
const PenaltyRule = "penalty"

// maxPenalty bounds a Penalty's durations: a year.
const maxPenalty = 365 * 24 * time.Hour

var (
	//go:embed penalty.lua
	penaltySrc string
	// The penalty box's gate for Allow, and its script for Peek.
	penaltyGate = mutex.NewGate(readStateFunc + penaltySrc)
	penaltyPeek = redis.NewScript(readStateFunc + penaltySrc)
)

// WithPenalty puts keys that keep being denied in a box (see Penalty). Keys
// with no state are then admitted through the lock like any other
// (WithUniformCost): the box is checked by the gate that reads the state.
// A bad Penalty is an error matching ErrInvalidOption.
func WithPenalty(p Penalty) Option {
	return func(lim *Limiter) error {
		if p.Denials < 1 || p.Within < time.Millisecond || p.For < time.Millisecond || p.Within > maxPenalty || p.For > maxPenalty {
			return fmt.Errorf("%w: penalty of %d denials within %v, for %v: want at least 1, within and for 1 ms to a year", ErrInvalidOption, p.Denials, p.Within, p.For)
		}
		lim.penalty = []any{p.Denials, p.Within.Microseconds(), p.For.Microseconds()}
		return nil
	}
}

// penalized returns the gate of a call with the penalty box (penalty.lua):
// count is "1" for Allow, "0" for Peek.
func (c call) penalized(box []any, count string) []any {
	args := make([]any, 0, len(c.ids)+4)
	args = append(args, c.ids...)
	args = append(args, box...)
	return append(args, count)
}

// unbox splits the end of the box off a penalty gate's reply ({now, values,
// [until]}): 0 when the key is not in the box.
func (lim *Limiter) unbox(c call, res any) (any, int64) {
	arr, ok := res.([]any)
	if lim.penalty == nil || !ok || len(arr) != len(c.rules)+2 {
		return res, 0
	}
	till, ok := arr[len(arr)-1].(int64)
	if !ok {
		return res, 0 // a reply of the wrong shape: parseRead reports it
	}
	return arr[:len(arr)-1], till
}

// boxed is the Result of a call denied by the penalty box until till,
// at server time now.
func boxed(d decision, rules []rule, now, till int64) Result {
	d.allowed = false
	res := d.result(rules)
	res.Allowed, res.Rule, res.Remaining = false, PenaltyRule, 0
	res.RetryAfter = micros(max(till-now, 1))
	return res
}
