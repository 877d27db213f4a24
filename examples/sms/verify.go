package main

import (
	"context"
	"net/http"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
)

func (s *Service) verify(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var req struct {
		Phone   string `json:"phone"`
		Country string `json:"country"`
		Code    string `json:"code"`
	}
	if err := decode(r, &req, "phone", "code"); err != nil {
		s.metrics.verifies.WithLabelValues("invalid").Inc()
		badRequest(w, err)
		return
	}
	if !sixDigits(req.Code) {
		s.metrics.verifies.WithLabelValues("invalid").Inc()
		writeJSON(w, http.StatusBadRequest, reply{Error: `field "code" must be 6 digits (0 to 9)`})
		return
	}
	dest, err := s.numbers.parse(req.Phone, req.Country, s.cfg.PrefixDigits)
	if err != nil {
		s.metrics.verifies.WithLabelValues("invalid").Inc()
		s.refused(w, err)
		return
	}
	// Guesses per address: one client cannot try codes for everyone.
	if d, err := s.ipVerify.Allow(ctx, clientIP(r, s.cfg.TrustProxy)); !d.Allowed {
		s.metrics.verifies.WithLabelValues(result(d, err)).Inc()
		s.denied(w, "ip", d, err)
		return
	}
	// From here the verification's Redis calls run to their end, each
	// within the Timeout, even if the client hangs up: a client that drops
	// the connection between the comparison of its guess and the count of
	// the failure must not escape the count.
	ctx = context.WithoutCancel(ctx)
	g := s.codes.guess(dest.E164, req.Code)
	failKey, rule := g.key, s.cfg.failureRule()
	// Is the number locked out? Read for every number alike: whether a
	// number is locked must not show in the work done for it.
	var lock funnel.Result
	err = s.bounded(ctx, func(ctx context.Context) (err error) {
		lock, err = s.failures.Peek(ctx, failKey, rule)
		return err
	})
	if err != nil {
		s.verdict(w, noCode, 0, err)
		return
	}
	v, err := s.check(ctx, g, !lock.Allowed)
	if err == nil && v == verified {
		s.converted(ctx, dest)
		s.credit(ctx, dest, g.key, clientIP(r, s.cfg.TrustProxy))
	}
	if err != nil || (v != wrongCode && v != spentCode) {
		// A right code costs the number nothing, nor does a guess with no
		// live code (strangers cannot lock its owner out before a code is
		// even sent). A locked number with no live code answers as one
		// that is not locked, so the lockout does not reveal a pending code.
		s.verdict(w, v, lock.RetryAfter, err)
		return
	}
	// The wrong guess was compared: it costs a unit of the number's daily
	// failures. Denied, the budget was spent by guesses checked beside this
	// one; failed, the guess was checked but not counted, so it is not
	// answered as an ordinary wrong code.
	var res funnel.Result
	err = s.bounded(ctx, func(ctx context.Context) (err error) {
		res, err = s.failures.Allow(ctx, failKey, rule)
		return err
	})
	if err != nil || !res.Allowed {
		s.verdict(w, locked, res.RetryAfter, err)
		return
	}
	s.verdict(w, v, 0, nil)
}

// check runs codes.check for g within the Timeout, and once more with the
// same g if that failed (Redis too slow to answer in time, say): the script
// may have run, and only it knows whether it used the code or counted a
// wrong guess; asked again, it answers as it did.
func (s *Service) check(ctx context.Context, g guess, lockedOut bool) (v verdict, err error) {
	for range 2 {
		err = s.bounded(ctx, func(ctx context.Context) (err error) {
			v, err = s.codes.check(ctx, g, lockedOut)
			return err
		})
		if err == nil {
			return v, nil
		}
	}
	return v, err
}

func (s *Service) verdict(w http.ResponseWriter, v verdict, wait time.Duration, err error) {
	switch {
	case err != nil:
		s.metrics.verifies.WithLabelValues("unavailable").Inc()
		s.metrics.redisErrors.Inc()
		writeJSON(w, http.StatusServiceUnavailable, reply{Error: "service unavailable, try again later", RetryAfter: seconds(time.Second)})
	case v == verified:
		s.metrics.verifies.WithLabelValues("ok").Inc()
		writeJSON(w, http.StatusOK, reply{Verified: true})
	case v == locked:
		s.metrics.verifies.WithLabelValues("locked").Inc()
		wait = max(wait, time.Second)
		writeJSON(w, http.StatusTooManyRequests, reply{Error: "too many failed verifications for this number: try again in " + humanWait(*seconds(wait)),
			Scope: "number", Rule: s.cfg.failureRule().Name, RetryAfter: seconds(wait)})
	case v == spentCode:
		// The one answer that differs from the others: it tells the guesser
		// that the code was live, now that it is not (see README).
		s.metrics.verifies.WithLabelValues("wrong").Inc()
		writeJSON(w, http.StatusUnauthorized, reply{Error: "wrong code, and that was the last attempt: request a new code",
			AttemptsLeft: new(int64)})
	default: // wrong, expired, used or never sent: one answer for all
		s.metrics.verifies.WithLabelValues("wrong").Inc()
		writeJSON(w, http.StatusUnauthorized, reply{Error: "wrong or expired code"})
	}
}

func sixDigits(code string) bool {
	if len(code) != 6 {
		return false
	}
	for i := range len(code) {
		if code[i] < '0' || code[i] > '9' {
			return false
		}
	}
	return true
}
