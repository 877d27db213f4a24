package guard

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
)

// Middleware returns net/http middleware that guards each request under the
// key keyFunc derives from it (a client IP, a phone number from the body:
// see ClientIP, JSONField and the other KeyFuncs).
//
//   - Admitted: the request goes on to the next handler, with the Decision
//     in its context (FromContext).
//   - Denied: 429 Too Many Requests, Retry-After in whole seconds rounded up
//     (never 0), and {"error": "...", "retry_after": seconds}; see
//     WithDeniedHandler.
//   - Redis unavailable and failing closed, or Redis refusing the call
//     (ErrRejected): 503 Service Unavailable, with Retry-After and the same
//     body. A denial of the fallback (FailOpen's rules in this process, or
//     Policy.Fallback) is a 429.
//   - With Policy.InFlight, an admitted request runs holding a permit of its
//     key's semaphore; one that gets none within Timeout (ErrBusy) is
//     answered 503 with Retry-After (ErrorRetryAfter, at least 1 s), and
//     its units are given back.
//   - keyFunc's error or an invalid key: 400 Bad Request; 413 for
//     ErrBodyTooLarge, 415 for ErrContentType, 500 for ErrInvalidKeyFunc.
//     The body's "error" is what the client can fix, the Fix of a
//     RequestError ({"error": "missing field \"phone\""}), or "invalid
//     request key" for an error without one: never the error itself.
//     WithErrorHandler replaces these answers and the 503s.
//
// WithSkip lets requests through unguarded, WithCost charges a request more
// than one unit, and with Policy.Shadow nothing is blocked. With
// Policy.RateLimitHeaders, responses also carry RateLimit-Policy (each
// rule's own quota) and RateLimit (the rule with the least room, or the one
// that denied) of draft-ietf-httpapi-ratelimit-headers-11.
func (g *Guard) Middleware(keyFunc KeyFunc, opts ...MiddlewareOption) func(http.Handler) http.Handler {
	mc := newMiddlewareConfig(opts)
	return func(next http.Handler) http.Handler {
		return &guarded{g: g, keyFunc: keyFunc, mc: mc, next: next}
	}
}

// guarded is the handler Middleware puts in front of next.
type guarded struct {
	g       *Guard
	keyFunc KeyFunc
	mc      middlewareConfig
	next    http.Handler
}

func (h *guarded) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case h.mc.skip != nil && h.mc.skip(r):
		h.next.ServeHTTP(w, r)
	case h.keyFunc == nil:
		writeJSON(w, http.StatusInternalServerError, body{Error: "guard: Middleware without a key function"})
	default:
		h.guard(w, r)
	}
}

// guard decides for r with Enter, and passes it on or answers it.
func (h *guarded) guard(w http.ResponseWriter, r *http.Request) {
	key, n, err := h.request(r)
	if err != nil {
		h.mc.failed(w, r, Decision{}, err)
		return
	}
	c, err := h.g.Enter(r.Context(), key, n)
	defer c.Done()
	if h.g.p.RateLimitHeaders && c.answered {
		h.g.rateLimitHeaders(w.Header(), c.allowed, c.k.plan.rules, h.g.partitionKey(c.k.sk))
	}
	switch {
	case err != nil:
		h.mc.failed(w, r, c.Decision, err)
	case c.Admitted():
		h.next.ServeHTTP(w, r.WithContext(c.Context()))
	default:
		h.mc.denied(w, r, c.Decision)
	}
}

// request is the key of r and the units it costs.
func (h *guarded) request(r *http.Request) (string, int64, error) {
	key, err := h.keyFunc(r)
	if err != nil {
		return "", 0, fmt.Errorf("%w: %w", ErrInvalidKey, err)
	}
	n, err := h.mc.units(r)
	return key, n, err
}

// A MiddlewareOption configures Middleware.
type MiddlewareOption func(*middlewareConfig)

type middlewareConfig struct {
	skip   func(*http.Request) bool
	cost   func(*http.Request) (int64, error)
	denied func(http.ResponseWriter, *http.Request, Decision)
	failed func(http.ResponseWriter, *http.Request, Decision, error)
}

func newMiddlewareConfig(opts []MiddlewareOption) middlewareConfig {
	mc := middlewareConfig{denied: deniedJSON, failed: errorJSON}
	for _, o := range opts {
		if o != nil {
			o(&mc)
		}
	}
	return mc
}

// units is what r costs: 1 without WithCost.
func (mc *middlewareConfig) units(r *http.Request) (int64, error) {
	if mc.cost == nil {
		return 1, nil
	}
	n, err := mc.cost(r)
	if err != nil || n < 1 {
		return 0, &RequestError{Fix: "invalid request cost", Err: fmt.Errorf("%w: cost %d: %v", ErrInvalidKey, n, err)}
	}
	return n, nil
}

// WithSkip lets the requests for which skip returns true through without a
// decision (health checks, allow-listed clients): nothing is charged, and
// FromContext reports no Decision.
func WithSkip(skip func(*http.Request) bool) MiddlewareOption {
	return func(c *middlewareConfig) { c.skip = skip }
}

// WithCost charges each request the units cost returns (AllowN) instead of
// one; an error or a cost below 1 is answered as a bad key (400 by default).
func WithCost(cost func(*http.Request) (int64, error)) MiddlewareOption {
	return func(c *middlewareConfig) { c.cost = cost }
}

// WithDeniedHandler answers denied requests with h instead of the default
// 429 JSON (which sets Retry-After: RetryAfterSeconds(d.RetryAfter)). The
// RateLimit fields, if on, are already set.
func WithDeniedHandler(h func(w http.ResponseWriter, r *http.Request, d Decision)) MiddlewareOption {
	return func(c *middlewareConfig) {
		if h != nil {
			c.denied = h
		}
	}
}

// WithErrorHandler answers the requests the guard could not decide with h
// instead of the default JSON: err matches ErrInvalidKey (the key function
// failed, the key or cost is invalid: 400 by default), ErrUnavailable or
// ErrRejected while failing closed (503 with Retry-After), ErrBusy (no
// InFlight permit in time: 503 with Retry-After), or the request context's
// error (503). d is the denial that stands for the decision.
// What the client can fix is the Fix of the *RequestError in err's chain, if
// any (errors.As); err itself is for the server's logs.
func WithErrorHandler(h func(w http.ResponseWriter, r *http.Request, d Decision, err error)) MiddlewareOption {
	return func(c *middlewareConfig) {
		if h != nil {
			c.failed = h
		}
	}
}

// decisionKey is the request context's key of the Decision.
type decisionKey struct{}

// FromContext returns the Decision Middleware made for the request whose
// context ctx is (the handler's r.Context()), or Enter for the call whose
// context ctx is (Call.Context); false when none was made (a skipped
// request, or no Middleware).
func FromContext(ctx context.Context) (Decision, bool) {
	d, ok := ctx.Value(decisionKey{}).(Decision)
	return d, ok
}

// deniedJSON is the default answer to a denial: 429 with Retry-After.
func deniedJSON(w http.ResponseWriter, _ *http.Request, d Decision) {
	secs := RetryAfterSeconds(d.RetryAfter)
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	writeJSON(w, http.StatusTooManyRequests, body{Error: "too many requests", RetryAfter: secs})
}

// errorJSON is the default answer to a request the guard could not decide.
// A bad request's body says what the client can fix (RequestError.Fix), never
// the error chain, which names the server's code and may quote the request.
func errorJSON(w http.ResponseWriter, r *http.Request, d Decision, err error) {
	switch {
	case errors.Is(err, ErrInvalidKeyFunc):
		writeJSON(w, http.StatusInternalServerError, body{Error: "guard: invalid key function"})
	case errors.Is(err, ErrBodyTooLarge):
		writeJSON(w, http.StatusRequestEntityTooLarge, body{Error: fixOf(err, "request body too large")})
	case errors.Is(err, ErrContentType):
		writeJSON(w, http.StatusUnsupportedMediaType, body{Error: fixOf(err, "unsupported content type")})
	case errors.Is(err, ErrInvalidKey):
		writeJSON(w, http.StatusBadRequest, body{Error: fixOf(err, "invalid request key")})
	case errors.Is(err, funnel.ErrInvalidN): // a cost over a rule's capacity
		writeJSON(w, http.StatusBadRequest, body{Error: "the request costs more than the limit allows"})
	case errors.Is(err, ErrBusy): // before ErrUnavailable, which a count in this process matches too
		unavailableJSON(w, d, "too many requests in flight")
	case errors.Is(err, ErrUnavailable), errors.Is(err, ErrRejected):
		unavailableJSON(w, d, "rate limiter unavailable")
	case errors.Is(err, ErrPlan):
		unavailableJSON(w, d, "no plan for the request's key")
	default:
		writeJSON(w, http.StatusServiceUnavailable, body{Error: "request cancelled"})
	}
}

// unavailableJSON answers 503 with Retry-After: RetryAfterSeconds(d.RetryAfter).
func unavailableJSON(w http.ResponseWriter, d Decision, msg string) {
	secs := RetryAfterSeconds(d.RetryAfter)
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	writeJSON(w, http.StatusServiceUnavailable, body{Error: msg, RetryAfter: secs})
}

// RetryAfterSeconds converts a wait to the whole seconds of a Retry-After
// field: rounded up, and at least 1, so that a client told to wait never
// retries at once.
func RetryAfterSeconds(d time.Duration) int64 {
	return max(ceilSeconds(d), 1)
}

// ceilSeconds is d in whole seconds, rounded up, without overflowing near
// the largest Duration.
func ceilSeconds(d time.Duration) int64 {
	secs := int64(d / time.Second)
	if d%time.Second > 0 {
		secs++
	}
	return secs
}

type body struct {
	Error      string `json:"error"`
	RetryAfter int64  `json:"retry_after,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, b body) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(b)
}

// rateLimitHeaders writes the quota of every rule (RateLimit-Policy: q units
// per w seconds, as funnel.Rule.Quota says the rule means them, w rounded
// up) and the state of one rule (RateLimit): on an admission, the rule with
// the least room (Decision.Tightest: r units left, t seconds until it alone
// is empty, rounded up); on a denial, the rule that denied (Decision.Rule:
// r=0, t its RetryAfter), or the Tightest when the denial is no rule's (the
// penalty box), since the field names an item of RateLimit-Policy.
//
// The RateLimit field names the partition (pk): a byte sequence that is the
// same for every request of one key of this guard and tells nothing of the
// key (the first 9 bytes of a SHA-256 of the guard's prefix and its stored
// key, which is itself an HMAC with Policy.Secret).
func (g *Guard) rateLimitHeaders(h http.Header, d Decision, rules []funnel.Rule, pk string) {
	now := time.Now()
	pol := make([]string, len(rules))
	for i, r := range rules {
		q, w := r.Quota(now)
		pol[i] = sfString(r.Name) + ";q=" + strconv.FormatInt(q, 10) + ";w=" + strconv.FormatInt(max(ceilSeconds(w), 1), 10)
	}
	h.Set("RateLimit-Policy", strings.Join(pol, ", "))
	name, left, t := d.Tightest, d.Remaining, d.TightestReset
	if !d.Allowed {
		left, t = 0, d.RetryAfter
		if slices.ContainsFunc(rules, func(r funnel.Rule) bool { return r.Name == d.Rule }) {
			name = d.Rule
		}
	}
	h.Set("RateLimit", sfString(name)+";r="+strconv.FormatInt(left, 10)+";t="+strconv.FormatInt(ceilSeconds(t), 10)+pk)
}

// partitionKey is the pk parameter of the RateLimit field of the stored key
// sk (";pk=:...:").
func (g *Guard) partitionKey(sk string) string {
	sum := sha256.Sum256([]byte(g.p.Prefix + sk))
	return ";pk=:" + base64.StdEncoding.EncodeToString(sum[:9]) + ":"
}

// sfString encodes s as a structured-field string (RFC 8941 §3.3.3):
// printable ASCII only, with '"' and '\' escaped; other bytes become '?'.
func sfString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
