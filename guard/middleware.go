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
// key keyFunc derives from it (see ClientIP, JSONField and the other
// KeyFuncs), as Enter decides a call:
//
//   - Admitted: on to the next handler, the Decision in its context
//     (FromContext).
//   - Denied, by Redis or the fallback: 429 Too Many Requests, Retry-After
//     (RetryAfterSeconds), and {"error": "...", "retry_after": seconds};
//     see WithDeniedHandler.
//   - Failing closed, ErrRejected, ErrPlan or ErrBusy: 503 with Retry-After.
//   - keyFunc's error or an invalid key: 400; 413 for ErrBodyTooLarge, 415
//     for ErrContentType, 500 for ErrInvalidKeyFunc. The body's "error" is
//     the RequestError's Fix, or "invalid request key": never the error.
//     WithErrorHandler replaces these answers and the 503s.
//
// WithSkip and WithCost set what is guarded and what it costs; under
// WithShadow nothing is blocked.
func (g *Guard) Middleware(keyFunc KeyFunc, opts ...MiddlewareOption) func(http.Handler) http.Handler {
	mc := middlewareConfig{denied: deniedJSON, failed: errorJSON}
	for _, o := range opts {
		if o != nil {
			o(&mc)
		}
	}
	if keyFunc == nil {
		keyFunc = badKeyFunc("Middleware without a key function")
	}
	return func(next http.Handler) http.Handler {
		return &guarded{g: g, keyFunc: keyFunc, mc: mc, next: next}
	}
}

type guarded struct {
	g       *Guard
	keyFunc KeyFunc
	mc      middlewareConfig
	next    http.Handler
}

func (h *guarded) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.mc.skip != nil && h.mc.skip(r) {
		h.next.ServeHTTP(w, r)
		return
	}
	key, n, err := h.request(r)
	if err != nil {
		h.mc.failed(w, r, Decision{}, err)
		return
	}
	c, err := h.g.Enter(r.Context(), key, n)
	defer c.Done()
	if h.g.cfg.RateLimitHeaders && c.p.err == nil {
		h.g.rateLimitHeaders(w.Header(), c.p.d, c.p.k.rules, h.g.partitionKey(c.p.k.sk))
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

// request is r's key and its units (WithCost's, else 1).
func (h *guarded) request(r *http.Request) (string, int64, error) {
	key, err := h.keyFunc(r)
	if err != nil {
		return "", 0, fmt.Errorf("%w: %w", ErrInvalidKey, err)
	}
	if h.mc.cost == nil {
		return key, 1, nil
	}
	n, err := h.mc.cost(r)
	if err != nil || n < 1 {
		err = fmt.Errorf("%w: cost %d: %v", ErrInvalidKey, n, err)
		return "", 0, &RequestError{Fix: "invalid request cost", Err: err}
	}
	return key, n, nil
}

// A MiddlewareOption configures Middleware.
type MiddlewareOption func(*middlewareConfig)

type middlewareConfig struct {
	skip   func(*http.Request) bool
	cost   func(*http.Request) (int64, error)
	denied func(http.ResponseWriter, *http.Request, Decision)
	failed func(http.ResponseWriter, *http.Request, Decision, error)
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
// 429 JSON. The RateLimit fields, if on, are already set.
func WithDeniedHandler(h func(w http.ResponseWriter, r *http.Request, d Decision)) MiddlewareOption {
	return func(c *middlewareConfig) {
		if h != nil {
			c.denied = h
		}
	}
}

// WithErrorHandler answers the requests the guard could not decide (see
// Middleware) with h instead of the default JSON; d is the denial that
// stands for the decision. What the client can fix is the Fix of the
// *RequestError in err's chain, if any; err itself is for the server's logs.
func WithErrorHandler(h func(w http.ResponseWriter, r *http.Request, d Decision, err error)) MiddlewareOption {
	return func(c *middlewareConfig) {
		if h != nil {
			c.failed = h
		}
	}
}

type decisionKey struct{}

// FromContext returns the Decision Middleware made for the request whose
// context ctx is (r.Context() in the handler), or Enter for the call
// (Call.Context); false when none was made (a skipped request).
func FromContext(ctx context.Context) (Decision, bool) {
	d, ok := ctx.Value(decisionKey{}).(Decision)
	return d, ok
}

func deniedJSON(w http.ResponseWriter, _ *http.Request, d Decision) {
	retryJSON(w, http.StatusTooManyRequests, d, "too many requests")
}

// errorAnswers are errorJSON's answers, in order: the first whose error
// err matches gives the status and the body's error.
var errorAnswers = []struct {
	err    error
	status int
	msg    string
}{
	{ErrInvalidKeyFunc, http.StatusInternalServerError, "guard: invalid key function"},
	{ErrBodyTooLarge, http.StatusRequestEntityTooLarge, "request body too large"},
	{ErrContentType, http.StatusUnsupportedMediaType, "unsupported content type"},
	{ErrInvalidKey, http.StatusBadRequest, "invalid request key"},
	{funnel.ErrInvalidN, http.StatusBadRequest, "the request costs more than the limit allows"},
	// ErrBusy before ErrUnavailable, which a count in this process matches too.
	{ErrBusy, http.StatusServiceUnavailable, "too many requests in flight"},
	{ErrUnavailable, http.StatusServiceUnavailable, "rate limiter unavailable"},
	{ErrRejected, http.StatusServiceUnavailable, "rate limiter unavailable"},
	{ErrPlan, http.StatusServiceUnavailable, "no plan for the request's key"},
}

// errorJSON is the default answer to a request the guard could not decide;
// its body never holds the error chain, which may quote the request.
func errorJSON(w http.ResponseWriter, r *http.Request, d Decision, err error) {
	for _, a := range errorAnswers {
		switch {
		case !errors.Is(err, a.err):
			continue
		case a.status == http.StatusServiceUnavailable:
			retryJSON(w, a.status, d, a.msg)
		default:
			writeJSON(w, a.status, body{Error: fixOf(err, a.msg)})
		}
		return
	}
	writeJSON(w, http.StatusServiceUnavailable, body{Error: "request cancelled"})
}

func retryJSON(w http.ResponseWriter, status int, d Decision, msg string) {
	secs := RetryAfterSeconds(d.RetryAfter)
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	writeJSON(w, status, body{Error: msg, RetryAfter: secs})
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

// rateLimitHeaders writes the quota of every rule (RateLimit-Policy) and
// the state of one rule (RateLimit): after an admission the Tightest, after
// a denial the rule that denied (r=0), or the Tightest when no rule did (the
// penalty box), since the field names an item of RateLimit-Policy.
func (g *Guard) rateLimitHeaders(h http.Header, d Decision, rules []funnel.Rule, pk string) {
	now := time.Now()
	pol := make([]string, len(rules))
	for i, r := range rules {
		q, w := r.Quota(now)
		pol[i] = sfString(r.Name) + ";q=" + strconv.FormatInt(q, 10) + ";w=" + strconv.FormatInt(RetryAfterSeconds(w), 10)
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
// sk: the same for every request of the key, telling nothing of it.
func (g *Guard) partitionKey(sk string) string {
	sum := sha256.Sum256([]byte(g.cfg.Prefix + sk))
	return ";pk=:" + base64.StdEncoding.EncodeToString(sum[:9]) + ":"
}

// sfString encodes s as a structured-field string (RFC 8941 §3.3.3):
// printable ASCII only, with '"' and '\' escaped; other bytes become '?'.
func sfString(s string) string {
	b := []byte{'"'}
	for i := range len(s) {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return string(append(b, '"'))
}
