package guard

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/mutex"
)

// FailureMode says what a Guard decides when Redis cannot answer.
type FailureMode int

const (
	// FailClosed denies (the default: an SMS costs money).
	FailClosed FailureMode = iota
	// FailOpen decides with the guard's rules in this process's memory
	// (funnel.Local, up to DefaultFallbackMax keys), unless WithFallback is
	// set: a fleet of N processes admits at most N times the rules' bound.
	FailOpen
)

// Defaults of a Guard's options.
const (
	DefaultPrefix      = "fg:guard:"
	DefaultTimeout     = 500 * time.Millisecond
	DefaultErrorRetry  = time.Second
	DefaultFallbackMax = 10000
	// DefaultInFlightLease is the lease of an InFlight permit.
	DefaultInFlightLease = 3 * time.Second
	// MinInFlightLease is the shortest WithInFlightLease: below it a
	// pause or a busy server would lose the permits of running calls.
	MinInFlightLease = 100 * time.Millisecond
	// MaxKeyLen is the longest key a Guard accepts, in bytes.
	MaxKeyLen = 4096
	// maxPlainKey is the longest key stored as it is; longer ones are hashed.
	maxPlainKey = 128
)

// config is a Guard's settings, as its Options set them (options.go).
type config struct {
	Prefix                                  string
	Rules                                   []funnel.Rule
	OnError                                 FailureMode
	Timeout, ErrorRetryAfter, InFlightLease time.Duration
	InFlight                                int64
	Normalize                               func(key string) (string, error)
	Secret                                  []byte
	Fallback                                *Fallback // nil: WithOnError's mode decides
	Observe                                 func(Observation)
	Trace                                   func(ctx context.Context, key string) (context.Context, func(Observation))
	Plans                                   map[string][]funnel.Rule
	PlanOf                                  func(ctx context.Context, key string) (string, error)
	Funnel                                  []funnel.Option // funnel.WithPrefix(Prefix) first
	RateLimitHeaders, Shadow                bool
}

// configure applies opts in order, fills in and checks what they leave,
// and makes the rules plan "", sharing states with the plans' (plans.go).
func configure(opts []Option) (config, error) {
	c := config{Prefix: DefaultPrefix}
	for i, o := range opts {
		if o == nil {
			return c, fmt.Errorf("%w: option %d is nil", ErrInvalidOption, i)
		}
		if err := o(&c); err != nil {
			return c, err
		}
	}
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.ErrorRetryAfter = cmp.Or(c.ErrorRetryAfter, DefaultErrorRetry)
	c.InFlightLease = cmp.Or(c.InFlightLease, DefaultInFlightLease)
	switch {
	case min(c.Timeout, c.ErrorRetryAfter) < 0:
		return c, fmt.Errorf("%w: negative Timeout or ErrorRetryAfter", ErrInvalidOption)
	case c.InFlightLease < MinInFlightLease || c.InFlightLease > mutex.MaxTTL:
		return c, fmt.Errorf("%w: InFlightLease %v: want %v to %v (or 0 for %v)", ErrInvalidOption, c.InFlightLease, MinInFlightLease, mutex.MaxTTL, DefaultInFlightLease)
	case len(c.Rules) == 0:
		return c, fmt.Errorf("%w: no rules (with WithPlans too, WithRules decide the keys whose plan is \"\")", ErrInvalidOption)
	case c.PlanOf != nil:
		c.Rules = sharing(c.Rules)
		c.Plans[""] = c.Rules
	}
	c.Funnel = append([]funnel.Option{funnel.WithPrefix(c.Prefix)}, c.Funnel...)
	return c, nil
}
