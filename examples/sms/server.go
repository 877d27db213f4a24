package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
)

//go:embed web
var webFS embed.FS

// Service is the verification-code service: send and verify endpoints, a
// page, health and metrics.
type Service struct {
	cfg      Config
	client   redis.UniversalClient
	phone    *guard.Guard    // per number: cooldown, hourly, daily
	ip       *guard.Guard    // per client IP
	failures *funnel.Limiter // failed verifications per number
	codes    *codeStore
	provider Provider
	log      *slog.Logger
	metrics  *metrics
}

// NewService builds the service on client.
func NewService(client redis.UniversalClient, cfg Config, provider Provider, log *slog.Logger) (*Service, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, client: client, provider: provider, log: log, metrics: newMetrics(),
		codes: &codeStore{client: client, secret: cfg.Secret, ttl: cfg.CodeTTL, maxAttempts: cfg.MaxAttempts, equal: hmac.Equal}}
	var err error
	// Numbers and addresses are stored as HMACs (guard.Policy.Secret).
	s.phone, err = guard.New(client, guard.Policy{Prefix: "sms:phone:", Rules: cfg.phoneRules(),
		Secret: cfg.Secret, Timeout: cfg.Timeout, Observe: s.metrics.observe("phone")})
	if err != nil {
		return nil, err
	}
	s.ip, err = guard.New(client, guard.Policy{Prefix: "sms:ip:", Rules: cfg.ipRules(),
		Secret: cfg.Secret, Timeout: cfg.Timeout, Observe: s.metrics.observe("ip")})
	if err != nil {
		return nil, err
	}
	s.failures = funnel.New(client, funnel.WithPrefix("sms:fail:"))
	return s, nil
}

// Handler returns the service's routes.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/sms/send", s.send)
	mux.HandleFunc("POST /api/sms/verify", s.verify)
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	page, _ := fs.Sub(webFS, "web")
	// The page alone, not "GET /": a pattern for every GET would make the
	// mux answer GET /api/sms/send with the file server's 404 instead of
	// 405, and list GET in the Allow header of the API's 405s.
	mux.Handle("GET /{$}", http.FileServerFS(page))
	return mux
}

type reply struct {
	Error      string `json:"error,omitempty"`
	RetryAfter *int64 `json:"retry_after,omitempty"`
	Verified   bool   `json:"verified,omitempty"`
}

func seconds(d time.Duration) *int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return &s
}

func writeJSON(w http.ResponseWriter, status int, r reply) {
	if r.RetryAfter != nil && status != http.StatusAccepted {
		w.Header().Set("Retry-After", strconv.FormatInt(max(*r.RetryAfter, 1), 10))
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(r)
}

// maxBody is the largest request body accepted, in bytes.
const maxBody = 4096

// errMediaType reports a body not declared as JSON.
var errMediaType = errors.New("body not declared as application/json")

// decode reads a small JSON body into v: one object, known fields only, and
// nothing after it but white space, all within maxBody bytes. The body must
// be declared as application/json: a cross-site form or a fetch with a
// text/plain body is sent by browsers without asking the server first (no
// CORS preflight), and would let any web page make its visitors request
// codes, each from their own address.
func decode(r *http.Request, v any) error {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return errMediaType
	}
	if r.ContentLength > maxBody {
		return &http.MaxBytesError{Limit: maxBody} // refused unread
	}
	body := http.MaxBytesReader(nil, r.Body, maxBody)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data")
	}
	// More stops at the first error: read to the end, so that white space
	// past the limit is refused too.
	rest, err := io.ReadAll(io.MultiReader(dec.Buffered(), body))
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return errors.New("trailing data")
	}
	return nil
}

// badRequest answers a body that decode refused: 415 when it is not
// declared as JSON, 413 when it is too large, 400 otherwise.
func badRequest(w http.ResponseWriter, err error) {
	var tooLarge *http.MaxBytesError
	switch {
	case errors.Is(err, errMediaType):
		writeJSON(w, http.StatusUnsupportedMediaType, reply{Error: "Content-Type must be application/json"})
	case errors.As(err, &tooLarge):
		writeJSON(w, http.StatusRequestEntityTooLarge, reply{Error: "request too large"})
	default:
		writeJSON(w, http.StatusBadRequest, reply{Error: "bad request"})
	}
}

// denied answers a guard's refusal: 503 when Redis could not answer (the
// guard fails closed), 429 with Retry-After otherwise.
func (s *Service) denied(w http.ResponseWriter, d guard.Decision, err error) {
	if d.Degraded || err != nil {
		writeJSON(w, http.StatusServiceUnavailable, reply{Error: "service unavailable, try again later", RetryAfter: seconds(max(d.RetryAfter, time.Second))})
		return
	}
	writeJSON(w, http.StatusTooManyRequests, reply{Error: "too many requests", RetryAfter: seconds(d.RetryAfter)})
}

func (s *Service) send(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var req struct {
		Phone string `json:"phone"`
	}
	if err := decode(r, &req); err != nil {
		s.metrics.sends.WithLabelValues("invalid").Inc()
		badRequest(w, err)
		return
	}
	phone, err := normalizePhone(req.Phone, s.cfg.Region)
	if err != nil {
		s.metrics.sends.WithLabelValues("invalid").Inc()
		writeJSON(w, http.StatusBadRequest, reply{Error: "invalid phone number"})
		return
	}
	ip := clientIP(r, s.cfg.TrustProxy)
	d, err := s.ip.Allow(ctx, ip)
	if !d.Allowed {
		s.metrics.sends.WithLabelValues(result(d, err)).Inc()
		s.denied(w, d, err)
		return
	}
	d, err = s.phone.Allow(ctx, phone)
	if !d.Allowed {
		s.refund(ctx, s.ip, ip) // a denied number does not cost its sender's address
		s.metrics.sends.WithLabelValues(result(d, err)).Inc()
		s.denied(w, d, err)
		return
	}
	code := newCode()
	if err := s.bounded(ctx, func(ctx context.Context) error { return s.codes.put(ctx, phone, code) }); err != nil {
		s.refund(ctx, s.phone, phone)
		s.refund(ctx, s.ip, ip)
		s.metrics.sends.WithLabelValues("unavailable").Inc()
		s.metrics.redisErrors.Inc()
		s.log.Error("storing a code failed", "to", maskPhone(phone), "err", err)
		s.denied(w, guard.Decision{Degraded: true}, err)
		return
	}
	text := fmt.Sprintf("Your verification code is %s. It expires in %d minutes.", code, int(s.cfg.CodeTTL.Minutes()))
	if err := s.provider.Send(ctx, phone, text); err != nil {
		_ = s.bounded(context.WithoutCancel(ctx), func(ctx context.Context) error { return s.codes.forget(ctx, phone) })
		s.refund(ctx, s.phone, phone)
		s.refund(ctx, s.ip, ip)
		s.metrics.sends.WithLabelValues("provider_error").Inc()
		s.log.Error("send failed", "to", maskPhone(phone), "err", err)
		writeJSON(w, http.StatusBadGateway, reply{Error: "could not send the code, try again"})
		return
	}
	s.metrics.sends.WithLabelValues("sent").Inc()
	s.log.Info("code sent", "to", maskPhone(phone))
	next, _ := s.phone.Peek(ctx, phone) // when the page may offer "resend"
	writeJSON(w, http.StatusAccepted, reply{RetryAfter: seconds(next.RetryAfter)})
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

func (s *Service) refund(ctx context.Context, g *guard.Guard, key string) {
	if err := g.Refund(context.WithoutCancel(ctx), key); err != nil {
		s.log.Warn("refund failed", "err", err)
	}
}

func (s *Service) verify(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var req struct {
		Phone string `json:"phone"`
		Code  string `json:"code"`
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
	phone, err := normalizePhone(req.Phone, s.cfg.Region)
	if err != nil {
		s.metrics.verifies.WithLabelValues("invalid").Inc()
		writeJSON(w, http.StatusBadRequest, reply{Error: "invalid phone number"})
		return
	}
	// Every check costs a unit of the number's daily failure budget, taken
	// before the check and given back only when the code is right: a wrong
	// guess can never go uncounted, even when Redis is slow. The budget is
	// the same for every number, known or not, so its 429 reveals nothing.
	failKey := s.codes.key(phone) // the number, hidden
	rule := s.cfg.failureRule()
	cctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	res, err := s.failures.Allow(cctx, failKey, rule)
	if err != nil || !res.Allowed {
		s.verdict(w, tooMany, res.RetryAfter, err)
		return
	}
	v, err := s.codes.check(cctx, phone, req.Code)
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
		writeJSON(w, http.StatusTooManyRequests, reply{Error: "too many attempts", RetryAfter: seconds(max(wait, time.Second))})
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

func (s *Service) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Timeout)
	defer cancel()
	if err := s.client.Ping(ctx).Err(); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, reply{Error: "redis unavailable"})
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write([]byte("ok\n"))
}
