package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// errProviderBusy reports a send that found Config.ProviderInFlight calls
// to the provider running, and none ending within ProviderInFlightWait.
var errProviderBusy = errors.New("every provider call in flight is taken")

// errInFlightRedis wraps the error of Redis while taking a provider permit.
var errInFlightRedis = errors.New("taking a provider permit")

// newProviderCalls returns the semaphore of the provider's calls in flight
// across the fleet: a permit per call, Config.ProviderInFlight of them; nil
// when the bound is off. Its keys are sms:inflight:{provider}:sem and
// sem:*, with TTLs, in one cluster slot. A permit's lease is guard's
// DefaultInFlightLease (3 s), renewed while the call runs: a replica killed
// mid-send frees its permits within it, not within mutex.DefaultTTL.
func newProviderCalls(client redis.UniversalClient, n int64) (*mutex.Semaphore, error) {
	if n == 0 {
		return nil, nil
	}
	l, err := mutex.New(client, mutex.WithPrefix("sms:inflight:"), mutex.WithTTL(guard.DefaultInFlightLease))
	if err != nil {
		return nil, err
	}
	return l.Semaphore("provider", n)
}

// deliverHeld is deliver holding a permit of the provider's calls in
// flight, when the service bounds them. It returns errProviderBusy when no
// permit comes free within ProviderInFlightWait, and an error matching
// errInFlightRedis when Redis could not answer.
func (s *Service) deliverHeld(ctx context.Context, dest destination, text string) error {
	if s.providerCalls == nil {
		return s.deliver(ctx, dest, text)
	}
	p, err := s.takePermit(ctx)
	if err != nil {
		return err
	}
	defer s.givePermit(ctx, p)
	// The call is not cancelled if the permit is lost (Redis lost it, or
	// could not renew it for a lease): the message may be on its way, and
	// a code the service forgot would reach the phone useless.
	return s.deliver(ctx, dest, text)
}

// takePermit takes one of the provider's permits: at once if one is free
// and nobody waits (one round trip, bounded by the Redis Timeout), else by
// waiting in their FIFO queue for ProviderInFlightWait. The permit's lease
// is renewed until it is given back, however long the provider takes.
func (s *Service) takePermit(ctx context.Context) (*mutex.Permit, error) {
	var p *mutex.Permit
	err := s.bounded(ctx, func(ctx context.Context) (err error) {
		p, err = s.providerCalls.TryAcquire(ctx, 1, mutex.WithAutoRenew())
		return err
	})
	if !errors.Is(err, mutex.ErrNoPermits) {
		return p, inFlightError(err)
	}
	wctx, cancel := context.WithTimeout(ctx, s.cfg.ProviderInFlightWait)
	defer cancel()
	p, err = s.providerCalls.Acquire(wctx, 1, mutex.WithAutoRenew())
	if errors.Is(err, mutex.ErrNotObtained) && ctx.Err() == nil {
		return nil, fmt.Errorf("%w: %d calls in flight through %v", errProviderBusy, s.providerCalls.Size(), s.cfg.ProviderInFlightWait)
	}
	return p, inFlightError(err)
}

func inFlightError(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", errInFlightRedis, err)
}

// givePermit gives p back, whatever happened to ctx; a permit whose release
// fails comes back when its lease ends.
func (s *Service) givePermit(ctx context.Context, p *mutex.Permit) {
	err := s.bounded(context.WithoutCancel(ctx), p.Release)
	if err != nil {
		s.metrics.redisErrors.Inc()
		s.log.Warn("giving a provider permit back failed: it comes back at its lease's end", "err", err)
	}
}

// providerBusyWait is the Retry-After of a send refused for want of a
// provider permit: the least a Retry-After says, as a permit comes free
// whenever a provider call ends.
const providerBusyWait = time.Second
