package guard

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Middleware returns net/http middleware that guards each request under the
// key keyFunc derives from it (a client IP, a phone number from the body...).
//
//   - Admitted: the request goes on to the next handler.
//   - Denied: 429 Too Many Requests, Retry-After in whole seconds rounded up
//     (never 0), and {"error": "...", "retry_after": seconds}.
//   - Redis unavailable and failing closed: 503 Service Unavailable, with
//     Retry-After and the same body.
//   - keyFunc's error or an invalid key: 400 Bad Request.
//
// With Policy.RateLimitHeaders, responses also carry RateLimit-Policy and
// RateLimit (draft-ietf-httpapi-ratelimit-headers).
func (g *Guard) Middleware(keyFunc func(*http.Request) (string, error)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key, err := keyFunc(r)
			if err != nil {
				writeJSON(w, http.StatusBadRequest, body{Error: "bad request: " + err.Error()})
				return
			}
			d, err := g.Allow(r.Context(), key)
			if g.p.RateLimitHeaders && err == nil {
				g.rateLimitHeaders(w.Header(), d)
			}
			switch {
			case errors.Is(err, ErrInvalidKey):
				writeJSON(w, http.StatusBadRequest, body{Error: "bad request: invalid key"})
			case d.Allowed:
				next.ServeHTTP(w, r)
			case d.Degraded && g.fb == nil: // failing closed
				secs := RetryAfterSeconds(d.RetryAfter)
				w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
				writeJSON(w, http.StatusServiceUnavailable, body{Error: "rate limiter unavailable", RetryAfter: secs})
			case err != nil && !d.Degraded: // the request's context ended
				writeJSON(w, http.StatusServiceUnavailable, body{Error: "request cancelled"})
			default:
				secs := RetryAfterSeconds(d.RetryAfter)
				w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
				writeJSON(w, http.StatusTooManyRequests, body{Error: "too many requests", RetryAfter: secs})
			}
		})
	}
}

// RetryAfterSeconds converts a wait to the whole seconds of a Retry-After
// field: rounded up, and at least 1, so that a client told to wait never
// retries at once.
func RetryAfterSeconds(d time.Duration) int64 {
	secs := int64((d + time.Second - 1) / time.Second)
	return max(secs, 1)
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
// per w seconds, the time a full funnel takes to drain) and the state of the
// rule that decided (RateLimit: r units remaining; t seconds until the call
// would be admitted when denied, or until every funnel is empty, an upper
// bound for the named rule, when admitted).
func (g *Guard) rateLimitHeaders(h http.Header, d Decision) {
	var pol []string
	for _, r := range g.p.Rules {
		window := (time.Duration(r.Capacity) * r.Per) / time.Duration(r.Leak)
		pol = append(pol, sfString(r.Name)+";q="+strconv.FormatInt(r.Capacity, 10)+";w="+strconv.FormatInt(RetryAfterSeconds(window), 10))
	}
	h.Set("RateLimit-Policy", strings.Join(pol, ", "))
	name, t := d.Tightest, d.ResetAfter
	if !d.Allowed {
		name, t = d.Rule, d.RetryAfter
	}
	secs := int64((t + time.Second - 1) / time.Second)
	h.Set("RateLimit", sfString(name)+";r="+strconv.FormatInt(d.Remaining, 10)+";t="+strconv.FormatInt(secs, 10))
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
