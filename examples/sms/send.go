package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/funnelguard/funnelguard/guard"
)

// charge is one guard a send must pass, for one key, and the scope a 429
// names when it denies.
type charge struct {
	scope string // number, ip, prefix, budget
	g     limiter
	key   string
}

// limiter is what a send is charged to: a *guard.Guard, or the conversion
// guard's record of the send (conversionSend).
type limiter interface {
	Allow(ctx context.Context, key string) (guard.Decision, error)
	Refund(ctx context.Context, key string) error
}

// scopeWords is how a 429 names each scope for people.
var scopeWords = map[string]string{
	"number":  "too many codes for this number",
	"ip":      "too many requests from your address",
	"prefix":  "too many codes to numbers like this one",
	"budget":  "the service has sent all the codes it may today",
	"country": "codes to this country are not being used",
	"group":   "codes to numbers like this one are not being used",
}

// A numberRequest names a phone number: the body of a send, of the demo's
// reset and of an operator's reset.
type numberRequest struct {
	Phone   string `json:"phone"`
	Country string `json:"country"` // the region of a number without +; the default region if empty
}

func (s *Service) send(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var req numberRequest
	if err := decode(r, &req, "phone"); err != nil {
		s.metrics.sends.WithLabelValues("invalid").Inc()
		badRequest(w, err)
		return
	}
	dest, err := s.numbers.parse(req.Phone, req.Country, s.cfg.PrefixDigits)
	if err != nil {
		s.metrics.sends.WithLabelValues("invalid").Inc()
		s.refused(w, err)
		return
	}
	if s.lockedOut(ctx, w, dest) {
		return
	}
	charges, note := s.charge(w, r, dest)
	if charges == nil {
		return
	}
	code := newCode()
	if err := s.bounded(ctx, func(ctx context.Context) error { return s.codes.put(ctx, dest.E164, code, note.String()) }); err != nil {
		s.refundAll(ctx, charges)
		s.metrics.sends.WithLabelValues("unavailable").Inc()
		s.metrics.redisErrors.Inc()
		s.log.Error("storing a code failed", "to", maskPhone(dest.E164), "err", err)
		s.denied(w, "", guard.Decision{Degraded: true}, err)
		return
	}
	text := fmt.Sprintf("Your verification code is %s. It expires in %d minutes.", code, int(s.cfg.CodeTTL.Minutes()))
	if err := s.deliverHeld(ctx, dest, text); err != nil {
		_ = s.bounded(context.WithoutCancel(ctx), func(ctx context.Context) error { return s.codes.forget(ctx, dest.E164) })
		s.refundAll(ctx, charges)
		s.notDelivered(w, dest, err)
		return
	}
	s.metrics.sends.WithLabelValues("sent").Inc()
	s.spent(ctx, dest, note.price)
	s.log.Info("code sent", "to", maskPhone(dest.E164))
	next, _ := s.phone.Peek(ctx, dest.E164) // when the page may offer "resend"
	writeJSON(w, http.StatusAccepted, reply{RetryAfter: seconds(next.RetryAfter), Number: dest.E164, Country: dest.Region})
}

// charge takes a unit from every guard a send to dest must pass, and its
// price from the money guards, and returns what it took and the note its
// code keeps (sendNote); a send a guard denies is answered here, and charge
// returns nil.
func (s *Service) charge(w http.ResponseWriter, r *http.Request, dest destination) ([]charge, sendNote) {
	// Every guard or none: a send denied by one takes nothing from those
	// before it (they are refunded) and never reaches those after it. The
	// hot keys, the budget and the money, are charged last, only for sends
	// every other guard admitted.
	charges := []charge{
		{"ip", s.ip, clientIP(r, s.cfg.TrustProxy)},
		{"number", s.phone, dest.E164},
		{"prefix", s.prefix, dest.Prefix},
		{"budget", s.budget, budgetKey},
	}
	note := sendNote{unproven: true, price: s.prices.price(dest.Region)}
	var pool *poolSend
	if s.pools != nil {
		// Before the counting guards: a refused send costs one read.
		pool = &poolSend{p: s.pools, dest: dest}
		charges = append([]charge{{"prefix", pool, ""}}, charges...)
	}
	if s.conversion != nil {
		// First: a paused prefix's sends cost one script, and take nothing
		// that would have to be given back.
		charges = append([]charge{{"prefix", s.conversion.send(dest), ""}}, charges...)
	}
	if !s.take(w, r, charges, nil) {
		return nil, note
	}
	var verified int64 // the country's codes verified in the last 24 hours
	if pool != nil {
		note.hour, note.unproven, verified = pool.hour, pool.unproven, pool.verified
	}
	money := s.moneyCharges(dest, note.price, note.unproven, verified)
	if !s.take(w, r, money, charges) {
		return nil, note
	}
	return append(charges, money...), note
}

// take charges each of charges in turn; at the first denial it gives back
// what it took and what taken holds, answers the send, and returns false.
func (s *Service) take(w http.ResponseWriter, r *http.Request, charges, taken []charge) bool {
	for i, c := range charges {
		d, err := c.g.Allow(r.Context(), c.key)
		if !d.Allowed {
			s.refundAll(r.Context(), append(taken[:len(taken):len(taken)], charges[:i]...))
			s.metrics.sends.WithLabelValues(result(d, err)).Inc()
			scope := c.scope
			if sc, ok := c.g.(interface{ scope() string }); ok {
				scope = sc.scope()
			}
			s.denied(w, scope, d, err)
			return false
		}
	}
	return true
}

// lockedOut answers a send to a number locked out of verification, which
// gets no code it could not use (429), or one whose lockout Redis could not
// tell (503); it reports whether it answered.
func (s *Service) lockedOut(ctx context.Context, w http.ResponseWriter, dest destination) bool {
	failKey, rule := s.codes.key(dest.E164), s.cfg.failureRule()
	var locked bool
	var wait time.Duration
	err := s.bounded(ctx, func(ctx context.Context) error {
		res, err := s.failures.Peek(ctx, failKey, rule)
		locked, wait = !res.Allowed, res.RetryAfter
		return err
	})
	switch {
	case err != nil:
		s.metrics.sends.WithLabelValues("unavailable").Inc()
		s.metrics.redisErrors.Inc()
		s.denied(w, "", guard.Decision{Degraded: true}, err)
	case locked:
		s.metrics.sends.WithLabelValues("locked").Inc()
		writeJSON(w, http.StatusTooManyRequests, reply{Error: "too many failed verifications for this number: try again in " + humanWait(*seconds(wait)),
			Scope: "number", Rule: rule.Name, RetryAfter: seconds(max(wait, time.Second))})
	}
	return err != nil || locked
}

// notDelivered answers a send whose code did not go out, with its code
// forgotten and its units refunded already: 503 with Retry-After when no
// provider call came free in time or Redis could not give one, 422 when the
// provider refused the number, 502 when it failed.
func (s *Service) notDelivered(w http.ResponseWriter, dest destination, err error) {
	switch {
	case errors.Is(err, errProviderBusy):
		s.metrics.sends.WithLabelValues("busy").Inc()
		s.log.Warn("send refused: the provider's calls in flight are all taken", "to", maskPhone(dest.E164), "err", err)
		writeJSON(w, http.StatusServiceUnavailable, reply{Error: "the SMS provider is busy: try again in a moment", RetryAfter: seconds(providerBusyWait)})
	case errors.Is(err, errInFlightRedis):
		s.metrics.sends.WithLabelValues("unavailable").Inc()
		s.metrics.redisErrors.Inc()
		s.log.Error("send failed", "to", maskPhone(dest.E164), "err", err)
		s.denied(w, "", guard.Decision{Degraded: true}, err)
	case errors.Is(err, ErrDestinationRefused):
		s.metrics.sends.WithLabelValues("refused").Inc()
		s.log.Error("send failed", "to", maskPhone(dest.E164), "err", err)
		writeJSON(w, http.StatusUnprocessableEntity, reply{Error: "the SMS provider refused this number: give another mobile number",
			Reason: "provider_refused", Number: dest.E164, Country: dest.Region})
	default:
		s.metrics.sends.WithLabelValues("provider_error").Inc()
		s.log.Error("send failed", "to", maskPhone(dest.E164), "err", err)
		writeJSON(w, http.StatusBadGateway, reply{Error: "could not send the code, try again"})
	}
}

// refused answers a number that is not one, or a country that is not a
// region, with what to fix (400), or a number that the number policy
// refuses (422, with the reason).
func (s *Service) refused(w http.ResponseWriter, err error) {
	var ref *refusal
	if errors.As(err, &ref) {
		writeJSON(w, http.StatusUnprocessableEntity, reply{Error: ref.Detail, Reason: ref.Reason, Number: ref.Number, Country: ref.Region})
		return
	}
	writeJSON(w, http.StatusBadRequest, reply{Error: fixOf(err, "invalid phone number")})
}

// refundAll gives back the unit each charge took, for a send that did not
// happen, whatever happened to the request's context. The refunds run at
// once: with Redis hung, the request waits one Timeout for them, not one per
// guard.
func (s *Service) refundAll(ctx context.Context, charges []charge) {
	ctx = context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	for _, c := range charges {
		wg.Go(func() {
			if err := c.g.Refund(ctx, c.key); err != nil {
				s.log.Warn("refund failed", "scope", c.scope, "err", err)
			}
		})
	}
	wg.Wait()
}

// denied answers a guard's refusal: 503 when Redis could not answer or
// refused the call (the guards fail closed), 429 naming the scope and rule,
// with Retry-After, otherwise.
func (s *Service) denied(w http.ResponseWriter, scope string, d guard.Decision, err error) {
	if d.Degraded || err != nil {
		writeJSON(w, http.StatusServiceUnavailable, reply{Error: "service unavailable, try again later", RetryAfter: seconds(max(d.RetryAfter, time.Second))})
		return
	}
	wait, words := seconds(d.RetryAfter), scopeWords[scope]
	if cw, ok := conversionWords[d.Rule]; ok {
		words = cw
	}
	writeJSON(w, http.StatusTooManyRequests, reply{Error: words + ": try again in " + humanWait(max(*wait, 1)),
		Scope: scope, Rule: d.Rule, RetryAfter: wait})
}

// bounded runs f, a Redis call, with ctx bounded by the Redis Timeout. Every
// Redis call of the service is bounded so: a request's own context has no
// deadline, and without one a hung Redis holds the call for go-redis's I/O
// timeout and its retries (5 to 10 s), not the Timeout.
func (s *Service) bounded(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	return f(ctx)
}

func result(d guard.Decision, err error) string {
	if d.Degraded || err != nil {
		return "unavailable"
	}
	return "denied"
}
