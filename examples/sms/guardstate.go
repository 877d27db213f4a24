package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/redis/go-redis/v9"
)

// guardStates reaches the guards' state from outside them: the demo's reset
// and the operators' tools read (Peek) and reset a guard's funnels under
// the keys the guard keeps them by. A guard has neither of its own; a
// Limiter on the guard's prefix reaches the same state, under the same
// locks, given the key as the guard stores it (storedKey).
type guardStates struct {
	secret []byte
	// By guard, as NewService names them: the Limiter on its prefix.
	ip, ipVerify, phone, prefix, budget *funnel.Limiter
}

// newGuardStates returns the state of the guards NewService builds with
// these prefixes and secret.
func newGuardStates(client redis.UniversalClient, secret []byte) (*guardStates, error) {
	d := &guardStates{secret: secret}
	for _, l := range []struct {
		to     **funnel.Limiter
		prefix string
	}{
		{&d.ip, "sms:ip:"}, {&d.ipVerify, "sms:vip:"}, {&d.phone, "sms:phone:"},
		{&d.prefix, "sms:prefix:"}, {&d.budget, "sms:budget:"},
	} {
		var err error
		if *l.to, err = funnel.New(client, funnel.WithPrefix(l.prefix)); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// storedKey is the key a guard with WithSecret keeps key's state under
// (guard.Guard's storedKey: "m:" and the key's HMAC-SHA256).
func (d *guardStates) storedKey(key string) string {
	m := hmac.New(sha256.New, d.secret)
	m.Write([]byte(key))
	return "m:" + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// stateReset is one funnel state to reset: a guard's (or the failures')
// Limiter and the key it stores the state under; name is what a reset says
// it lifted.
type stateReset struct {
	name string
	lim  *funnel.Limiter
	key  string
}

// numberResets are the states that limit the number e164 alone: its sends
// (cooldown, hourly, daily) and its failed verifications (the lockout).
func (s *Service) numberResets(e164 string) []stateReset {
	return []stateReset{
		{"number", s.states.phone, s.states.storedKey(e164)},
		{"verify-failures", s.failures, s.codes.key(e164)},
	}
}

// resetStates resets each state, within the Redis Timeout each, and returns
// the names of those reset, once each, in order; it stops at the first
// error.
func (s *Service) resetStates(ctx context.Context, resets []stateReset) ([]string, error) {
	var done []string
	for _, x := range resets {
		if err := s.bounded(ctx, func(ctx context.Context) error { return x.lim.Reset(ctx, x.key) }); err != nil {
			s.metrics.redisErrors.Inc()
			return done, err
		}
		if len(done) == 0 || done[len(done)-1] != x.name {
			done = append(done, x.name)
		}
	}
	return done, nil
}
