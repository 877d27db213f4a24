package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// checks watches the runs of check.lua, where the service compares codes:
// how many compared a guess with a live code (answered right or wrong), and
// the guess's MAC each run was given. A go-redis hook: add it with
// watchChecks.
type checks struct {
	right, wrong atomic.Int64
	mu           sync.Mutex
	macs         []string // ARGV[1] of every run
}

// watchChecks hooks checks into the service's client.
func (e *env) watchChecks() *checks {
	c := &checks{}
	e.svc.client.AddHook(c)
	return c
}

func (c *checks) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *checks) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (c *checks) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		// EVALSHA or EVAL, the script, 1, the key, ARGV... A NOSCRIPT
		// reply is an error: the EVAL that follows is counted instead.
		args := cmd.Args()
		if err != nil || len(args) < 5 || (args[1] != checkScript.Hash() && args[1] != checkSrc) {
			return err
		}
		c.mu.Lock()
		c.macs = append(c.macs, fmt.Sprint(args[4]))
		c.mu.Unlock()
		if rc, ok := cmd.(*redis.Cmd); ok {
			switch n, _ := rc.Int(); verdict(n) {
			case verified:
				c.right.Add(1)
			case wrongCode, spentCode:
				c.wrong.Add(1)
			}
		}
		return err
	}
}

// runs returns how many times check.lua ran.
func (c *checks) runs() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.macs)
}

var hexMAC = regexp.MustCompile(`^[0-9a-f]{64}$`)

// fixedLength fails t unless every run of check.lua was given a MAC of 64
// hex digits, the length of every stored one (see storedMAC).
func (c *checks) fixedLength(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, m := range c.macs {
		if !hexMAC.MatchString(m) {
			t.Fatalf("check %d was given %q; want a MAC of 64 hex digits", i+1, m)
		}
	}
}

// storedMAC returns the MAC of phone's live code, "" if it has none.
func (e *env) storedMAC(phone string) string {
	e.t.Helper()
	m, err := e.svc.client.HGet(context.Background(), e.svc.codes.key(phone), "m").Result()
	if err == redis.Nil {
		return ""
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return m
}

// 200 wrong codes at once for one number, in rounds of a code of their own,
// with a daily failure budget large enough for all of them to reach the
// code: each time MaxAttempts guesses are compared, not one more, counted
// where check.lua answers; the code is spent (its MAC is gone from Redis),
// and the right code is refused without being compared, because the code
// is spent (not by the failure budget, which has room).
func TestConcurrentGuessesCheckedAtMostMaxAttempts(t *testing.T) {
	const rounds, n = 5, 200
	opts := []func(*Config){noIPLimits, func(c *Config) {
		c.MaxDailyFailures = 1000
		c.Timeout = 10 * time.Second // this test is about attempts, not a slow Redis
	}}
	onBackends(t, opts, func(t *testing.T, e *env) {
		chk := e.watchChecks()
		compared := make([]int64, rounds)
		for round := range rounds {
			phone := phoneN(round)
			e.want(e.send(phone), http.StatusAccepted, "send")
			code := e.sms.code(t, phone)
			before := chk.wrong.Load()
			count := e.verifyAtOnce(phone, n, func(i int) string { return wrong(code, i) })
			compared[round] = chk.wrong.Load() - before
			if count[http.StatusUnauthorized] != n {
				t.Errorf("round %d: statuses = %v; want %d × 401 (a spent code is answered as a wrong one)", round, count, n)
			}
			if compared[round] > e.cfg.MaxAttempts {
				t.Fatalf("round %d: %d guesses compared; want at most %d", round, compared[round], e.cfg.MaxAttempts)
			} else if compared[round] != e.cfg.MaxAttempts {
				t.Errorf("round %d: %d guesses compared; want %d (200 tried)", round, compared[round], e.cfg.MaxAttempts)
			}
			if m := e.storedMAC(phone); m != "" {
				t.Fatalf("round %d: the code is still stored after %d wrong guesses", round, n)
			}
			runs := chk.runs()
			e.want(e.verify(phone, code), http.StatusUnauthorized, "the right code after the code was spent")
			if chk.runs() != runs+1 || chk.right.Load() != 0 || chk.wrong.Load() != before+compared[round] {
				t.Fatalf("round %d: the right code of a spent code was compared", round)
			}
		}
		t.Logf("%d rounds of %d wrong codes at once: guesses compared per round %v", rounds, n, compared)
		chk.fixedLength(t)
		if got := e.metric("sms_verify_total", `outcome="wrong"`); got != rounds*(n+1) {
			t.Errorf("sms_verify_total{outcome=wrong} = %v; want %d", got, rounds*(n+1))
		}
	})
}

// A right code verifies once, whatever runs beside it: 50 verifications of
// it at once (retries, double clicks, a flaky app), in 20 rounds of a code
// of their own, are answered exactly one 200 and 49 × 401 (the code is
// used); a right code is not an attempt, so none is counted against the
// code or the number's daily failures; the code is refused afterwards.
// (When every verification was counted as an attempt before its code was
// compared, the sixth deleted the code: most rounds had no 200 at all.)
func TestConcurrentRightCodeVerifiesOnce(t *testing.T) {
	const rounds, n = 20, 50
	opts := []func(*Config){noIPLimits, func(c *Config) { c.Timeout = 10 * time.Second }}
	onBackends(t, opts, func(t *testing.T, e *env) {
		chk := e.watchChecks()
		ok := make([]int, rounds)
		for round := range rounds {
			phone := phoneN(round)
			e.want(e.send(phone), http.StatusAccepted, "send")
			code := e.sms.code(t, phone)
			count := e.verifyAtOnce(phone, n, func(int) string { return code })
			ok[round] = count[http.StatusOK]
			if count[http.StatusOK] != 1 || count[http.StatusUnauthorized] != n-1 {
				t.Errorf("round %d: %d verifications of the right code at once: %v; want one 200, the rest 401", round, n, count)
			}
			if left := e.failuresLeft(phone); left != e.cfg.MaxDailyFailures {
				t.Errorf("round %d: daily failures left = %d; want all %d (a right code is no failure)", round, left, e.cfg.MaxDailyFailures)
			}
			e.want(e.verify(phone, code), http.StatusUnauthorized, "the code used a second time")
		}
		t.Logf("%d rounds of %d verifications of the right code at once: 200s per round %v", rounds, n, ok)
		if right, wrong := chk.right.Load(), chk.wrong.Load(); right != rounds || wrong != 0 {
			t.Fatalf("check.lua answered right %d times and wrong %d times; want %d and 0", right, wrong, rounds)
		}
		chk.fixedLength(t)
	})
}

// The right code among wrong guesses at once: 50 verifications of the right
// code and MaxAttempts-1 wrong guesses (too few to spend the code), in 20
// rounds, give exactly one 200; the wrong guesses compared before the code
// was used cost the number one daily failure each, and no other does.
func TestRightCodeBesideWrongGuesses(t *testing.T) {
	const rounds, n = 20, 50
	opts := []func(*Config){noIPLimits, func(c *Config) { c.Timeout = 10 * time.Second }}
	onBackends(t, opts, func(t *testing.T, e *env) {
		chk := e.watchChecks()
		wrongs := int(e.cfg.MaxAttempts) - 1
		ok, compared := make([]int, rounds), make([]int64, rounds)
		for round := range rounds {
			phone := phoneN(round)
			e.want(e.send(phone), http.StatusAccepted, "send")
			code := e.sms.code(t, phone)
			before := chk.wrong.Load()
			count := e.verifyAtOnce(phone, n+wrongs, func(i int) string {
				if i < wrongs {
					return wrong(code, i)
				}
				return code
			})
			ok[round], compared[round] = count[http.StatusOK], chk.wrong.Load()-before
			if count[http.StatusOK] != 1 || count[http.StatusUnauthorized] != n+wrongs-1 {
				t.Errorf("round %d: %d right and %d wrong at once: %v; want one 200, the rest 401", round, n, wrongs, count)
			}
			if left, want := e.failuresLeft(phone), e.cfg.MaxDailyFailures-compared[round]; left != want {
				t.Errorf("round %d: daily failures left = %d; want %d (%d wrong guesses compared)", round, left, want, compared[round])
			}
		}
		t.Logf("%d rounds of %d right and %d wrong at once: 200s per round %v, wrong guesses compared %v", rounds, n, wrongs, ok, compared)
		if right := chk.right.Load(); right != rounds {
			t.Fatalf("check.lua answered right %d times; want %d", right, rounds)
		}
	})
}

// Codes are compared as fixed-length MACs (check.lua says why that keeps
// the comparison's time flat): the stored MAC and every guess's have 64 hex
// digits, and a guess that is not 6 ASCII digits (another length, other
// characters) is refused with 400 before check.lua runs, without a panic and
// without spending one of the code's attempts.
func TestCodeComparison(t *testing.T) {
	e := newEnv(t)
	chk := e.watchChecks()
	e.want(e.send(number), http.StatusAccepted, "send")
	code := e.sms.code(t, number)
	if m := e.storedMAC(number); !hexMAC.MatchString(m) {
		t.Fatalf("stored MAC %q; want 64 hex digits", m)
	}

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
	if got := chk.runs(); got != 0 {
		t.Fatalf("check.lua ran %d times for malformed codes; want never", got)
	}

	e.want(e.verify(number, wrong(code, 0)), http.StatusUnauthorized, "a wrong code")
	e.want(e.verify(number, code), http.StatusOK, "the right code after the malformed ones")
	if right, wrong := chk.right.Load(), chk.wrong.Load(); right != 1 || wrong != 1 {
		t.Fatalf("%d right and %d wrong comparisons; want one each", right, wrong)
	}
	chk.fixedLength(t)
}
