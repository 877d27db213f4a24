package main

import (
	"context"
	"net/http"
	"time"
)

func (s *Service) verify(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var req struct {
		Phone   string `json:"phone"`
		Country string `json:"country"`
		Code    string `json:"code"`
	}
	if err := decode(r, &req); err != nil {
		s.metrics.verifies.WithLabelValues("invalid").Inc()
		badRequest(w, err)
		return
	}
	if !sixDigits(req.Code) {
		s.metrics.verifies.WithLabelValues("invalid").Inc()
		writeJSON(w, http.StatusBadRequest, reply{Error: "bad request"})
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
	phone := dest.E164
	cctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	a, err := s.codes.begin(cctx, phone, req.Code)
	if err != nil || a.state == noCode {
		// No code outstanding: nothing to guess, and nothing counted
		// against the number, so that guesses of strangers cannot lock its
		// owner out before a code is even sent.
		s.verdict(w, noCode, 0, err)
		return
	}
	// A code is outstanding: this check costs a unit of the number's
	// daily failure budget, taken before the comparison and given back only
	// when the code is right, so a wrong guess never goes uncounted, even
	// when Redis is slow.
	failKey, rule := s.codes.key(phone), s.cfg.failureRule()
	res, err := s.failures.Allow(cctx, failKey, rule)
	if err != nil || !res.Allowed {
		s.verdict(w, tooMany, res.RetryAfter, err)
		return
	}
	v, err := s.codes.finish(cctx, a)
	if err == nil && v == verified {
		if rerr := s.bounded(context.WithoutCancel(ctx), func(ctx context.Context) error {
			return s.failures.Refund(ctx, failKey, 1, rule)
		}); rerr != nil {
			s.log.Warn("refund of a verification failed", "err", rerr)
		}
	}
	if v == tooMany {
		// The code was just invalidated: answer as for any wrong or expired
		// code, so that the attempt limit does not reveal a pending code.
		v = noCode
	}
	s.verdict(w, v, 0, err)
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
	case v == tooMany:
		s.metrics.verifies.WithLabelValues("locked").Inc()
		wait = max(wait, time.Second)
		writeJSON(w, http.StatusTooManyRequests, reply{Error: "too many failed verifications for this number: try again in " + humanWait(*seconds(wait)),
			Scope: "number", Rule: s.cfg.failureRule().Name, RetryAfter: seconds(wait)})
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
