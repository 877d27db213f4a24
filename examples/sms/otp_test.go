package main

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// comparisons watches the comparisons of codes where the service makes
// them, in codeStore.check.
type comparisons struct {
	n       atomic.Int64
	mu      sync.Mutex
	lengths [][2]int // of the stored MAC and of the guess's, per comparison
}

// watchComparisons wraps the service's comparison in one that counts its
// calls and records the lengths of their inputs.
func (e *env) watchComparisons() *comparisons {
	c := &comparisons{}
	equal := e.svc.codes.equal
	e.svc.codes.equal = func(stored, guess []byte) bool {
		c.n.Add(1)
		c.mu.Lock()
		c.lengths = append(c.lengths, [2]int{len(stored), len(guess)})
		c.mu.Unlock()
		return equal(stored, guess)
	}
	return c
}

// fixedLength fails t unless every comparison was of two MACs of 64 hex
// digits.
func (c *comparisons) fixedLength(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, l := range c.lengths {
		if l != [2]int{64, 64} {
			t.Fatalf("comparison %d of inputs of %d and %d bytes; want two 64-digit MACs", i+1, l[0], l[1])
		}
	}
}

// 200 wrong codes at once for one number, with a daily failure budget large
// enough for all of them to reach the code: at most MaxAttempts guesses are
// compared, counted where the comparison is made; the code is then gone
// from Redis, and the right code is refused because the code is spent (not
// by the failure budget, which has room).
func TestConcurrentGuessesCheckedAtMostMaxAttempts(t *testing.T) {
	opts := []func(*Config){noIPLimits, func(c *Config) {
		c.MaxDailyFailures = 1000
		c.Timeout = 10 * time.Second // this test is about attempts, not a slow Redis
	}}
	onBackends(t, opts, func(t *testing.T, e *env) {
		cmp := e.watchComparisons()
		e.want(e.send(number), http.StatusAccepted, "send")
		code := e.sms.code(t, number)

		const n = 200
		count := e.verifyAtOnce(number, n, func(i int) string { return wrong(code, i) })
		checked := cmp.n.Load()
		t.Logf("%d wrong codes at once: %d compared, statuses %v", n, checked, count)
		if count[http.StatusUnauthorized] != n {
			t.Errorf("statuses = %v; want %d × 401 (a spent code is answered as a wrong one)", count, n)
		}
		if checked > e.cfg.MaxAttempts {
			t.Fatalf("%d guesses compared; want at most %d", checked, e.cfg.MaxAttempts)
		} else if checked != e.cfg.MaxAttempts {
			t.Errorf("%d guesses compared; want %d (200 tried)", checked, e.cfg.MaxAttempts)
		}
		cmp.fixedLength(t)
		if left, err := e.svc.client.Exists(context.Background(), e.svc.codes.key(number)).Result(); err != nil || left != 0 {
			t.Fatalf("the code is still stored (%d, %v) after %d wrong guesses", left, err, n)
		}
		if got := e.metric("sms_verify_total", `outcome="wrong"`); got != n {
			t.Errorf("sms_verify_total{outcome=wrong} = %v; want %d", got, n)
		}

		r := e.verify(number, code)
		e.want(r, http.StatusUnauthorized, "the right code after the code was spent")
		if got := cmp.n.Load(); got != checked {
			t.Fatalf("the right code of a spent code was compared (%d comparisons, were %d)", got, checked)
		}
	})
}

// A code verifies once: of MaxAttempts requests with the right code at once
// (all within the attempt limit, so none voids the code), exactly one is
// answered 200; the code is refused afterwards.
func TestCodeSingleUse(t *testing.T) {
	onBackends(t, []func(*Config){func(c *Config) { c.Timeout = 10 * time.Second }}, func(t *testing.T, e *env) {
		cmp := e.watchComparisons()
		e.want(e.send(number), http.StatusAccepted, "send")
		code := e.sms.code(t, number)

		k := int(e.cfg.MaxAttempts)
		count := e.verifyAtOnce(number, k, func(int) string { return code })
		if count[http.StatusOK] != 1 || count[http.StatusUnauthorized] != k-1 {
			t.Fatalf("%d verifications of one code at once: %v; want one 200, the rest 401", k, count)
		}
		// The requests that come after the one that used the code find none.
		if got := cmp.n.Load(); got < 1 || got > int64(k) {
			t.Errorf("%d comparisons; want 1 to %d", got, k)
		}
		cmp.fixedLength(t)
		e.want(e.verify(number, code), http.StatusUnauthorized, "the code used a second time")
	})
}

// Codes are compared as fixed-length MACs in constant time: the comparison
// is hmac.Equal itself, it always gets two 64-digit MACs, and a guess that
// is not 6 ASCII digits (another length, other characters) is refused with
// 400 before any comparison, without a panic and without spending one of
// the code's attempts.
func TestCodeComparison(t *testing.T) {
	e := newEnv(t)
	if got, want := reflect.ValueOf(e.svc.codes.equal).Pointer(), reflect.ValueOf(hmac.Equal).Pointer(); got != want {
		t.Fatalf("codes are compared with the function at %#x; want hmac.Equal", got)
	}
	cmp := e.watchComparisons()
	e.want(e.send(number), http.StatusAccepted, "send")
	code := e.sms.code(t, number)

	for _, bad := range append(payloads, "1", "12345", "1234567", code+"0", " "+code, code+"\n", code+"\x00",
		code[:5]+"a", "12 456", "-12345", "+12345", "1e+05", "１２３４５６", "١٢٣٤٥٦", "é1234",
		strings.Repeat("1", 1<<10), strings.Repeat(code, 500)) {
		body, _ := json.Marshal(map[string]string{"phone": number, "code": bad})
		r := e.do("POST", "/api/sms/verify", string(body))
		if r.status != http.StatusBadRequest || r.body.Error == "" {
			t.Errorf("code %q = %v; want 400 with an error", bad, r)
		}
	}
	for _, body := range []string{
		`{"phone":"` + number + `","code":` + code + `}`, // a number, not a string
		`{"phone":"` + number + `","code":null}`,
		`{"phone":"` + number + `","code":["` + code + `"]}`,
		`{"phone":"` + number + `"}`,
	} {
		if r := e.do("POST", "/api/sms/verify", body); r.status != http.StatusBadRequest {
			t.Errorf("%s = %v; want 400", body, r)
		}
	}
	if got := cmp.n.Load(); got != 0 {
		t.Fatalf("%d malformed codes were compared; want none", got)
	}

	e.want(e.verify(number, wrong(code, 0)), http.StatusUnauthorized, "a wrong code")
	e.want(e.verify(number, code), http.StatusOK, "the right code after the malformed ones")
	if got := cmp.n.Load(); got != 2 {
		t.Fatalf("%d comparisons; want 2 (the wrong code and the right one)", got)
	}
	cmp.fixedLength(t)
}
