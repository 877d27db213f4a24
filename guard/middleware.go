package guard

import (
	"encoding/json"
	"errors"
	"math"
	"math/big"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
)

// Middleware returns net/http middleware that guards each request under the
// key keyFunc derives from it (a client IP, a phone number from the body...).
//
//   - Admitted: the request goes on to the next handler.
//   - Denied: 429 Too Many Requests, Retry-After in whole seconds rounded up
//     (never 0), and {"error": "...", "retry_after": seconds}.
//   - Redis unavailable and failing closed, or Redis refusing the call
//     (ErrRejected): 503 Service Unavailable, with Retry-After and the same
//     body. A denial of the fallback (FailOpen's rules in this process, or
//     Policy.Fallback) is a 429.
//   - keyFunc's error or an invalid key: 400 Bad Request.
//
// With Policy.RateLimitHeaders, responses also carry RateLimit-Policy and
// RateLimit (draft-ietf-httpapi-ratelimit-headers).
func (g *Guard) Middleware(keyFunc func(*http.Request) (string, error)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if keyFunc == nil {
				writeJSON(w, http.StatusInternalServerError, body{Error: "guard: Middleware without a key function"})
				return
			}
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
			case errors.Is(err, ErrRejected) || (d.Degraded && g.fb == nil && g.local == nil): // failing closed
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

// drainSeconds is how long a full funnel of r takes to empty, in whole
// seconds rounded up: Capacity*Per/Leak, computed without overflow (Capacity
// and Per can each be near their maximum).
func drainSeconds(r funnel.Rule) int64 {
	var n, q big.Int
	n.Mul(big.NewInt(r.Capacity), big.NewInt(int64(r.Per)))
	d := new(big.Int).Mul(big.NewInt(r.Leak), big.NewInt(int64(time.Second)))
	var m big.Int
	q.DivMod(&n, d, &m)
	if m.Sign() > 0 {
		q.Add(&q, big.NewInt(1))
	}
	if !q.IsInt64() {
		return math.MaxInt64
	}
	return q.Int64()
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
		pol = append(pol, sfString(r.Name)+";q="+strconv.FormatInt(r.Capacity, 10)+";w="+strconv.FormatInt(max(drainSeconds(r), 1), 10))
	}
	h.Set("RateLimit-Policy", strings.Join(pol, ", "))
	name, t := d.Tightest, d.ResetAfter
	if !d.Allowed {
		name, t = d.Rule, d.RetryAfter
	}
	secs := ceilSeconds(t)
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
