package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// A number that has had codes and a number never seen must not be told apart
// by the time the service takes to answer a send or a wrong code. Timing the
// answers cannot show that on a shared machine (medians of thousands drift
// apart under load by more than one round trip costs), so this test checks
// what the time is made of: for each kind of number the service sends Redis
// the same commands (the same scripts, in the same round trips, on keys of
// the same form: the number's HMAC, computed for both), and answers with the
// same status, body and headers. A service that skipped the code lookup for
// a number it had never seen, or made one more round trip for a number that
// has had codes (an EXISTS first, a separate GET of the attempts), fails
// here; the control at the end checks that such a round trip is seen. (A
// guess for a number with a code pending does more: see the verify part.)
//
// Not covered: CPU work that sends nothing, such as the guess's HMAC, which
// codeStore.guess computes before Redis is asked for every number, and the
// work inside check.lua (a number with no code pending, known or not, makes
// it read two fields of a hash and answer 0).
func TestEnumerationTiming(t *testing.T) {
	t.Run("miniredis", func(t *testing.T) {
		b := testutil.Mini(t)
		b.Mini.SetTime(t0)
		rec := &testutil.CommandRecorder{}
		client := b.Client(t)
		client.AddHook(rec)
		e := newEnvOn(t, client, enumerationConfig)
		e.b = b
		enumeration(t, e, rec, func() {
			e.at(e.cfg.Cooldown)
			// The server's clock stepped forward: each guard's first call
			// after it finds its bound on Redis's time too early, and is
			// decided again (funnel: "A failed call is not charged"). A
			// send to a number of neither kind takes that round trip.
			e.want(e.send(phoneN(200)), http.StatusAccepted, "a send after the clock's step")
		})
	})
	t.Run("redis", func(t *testing.T) {
		srv := testutil.StartServer(t) // the service's keys have no test prefix: a server of its own
		rec := &testutil.CommandRecorder{}
		client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { client.Close() })
		client.AddHook(rec)
		e := newEnvOn(t, client, enumerationConfig, func(c *Config) {
			// The server's clock runs: a short cooldown, waited out below;
			// long enough that no send reaches its Peek of the next send's
			// wait after it ended, however loaded the machine (at 50 ms, a
			// known number's 202 once said retry_after 0, a fresh one's 1).
			c.Cooldown = 2 * time.Second
		})
		enumeration(t, e, rec, func() {})
	})
}

func enumerationConfig(c *Config) {
	c.IPHourly, c.IPDaily = 100_000, 100_000
	c.Timeout = 10 * time.Second // a stall under load must not turn into a 503
}

// enumeration runs TestEnumerationTiming on e, whose client rec watches;
// pastCooldown lets the cooldown of the codes sent so far pass on a server
// whose clock the test sets (on a running clock, enumeration waits).
func enumeration(t *testing.T, e *env, rec *testutil.CommandRecorder, pastCooldown func()) {
	ctx := context.Background()
	const n = 4 // pairs of each kind: the work does not depend on the round, a few show it
	known := make([]string, n)
	for i := range known {
		known[i] = phoneN(i)
	}
	next := 1_000_000
	fresh := func() string { next++; return phoneN(next) }

	// The first calls differ from the later ones for reasons of their own
	// (scripts loaded with EVAL, a Locker's first lock taken by script): a
	// number of each kind goes through both endpoints before anything is
	// compared.
	for _, phone := range []string{phoneN(100), fresh()} {
		e.want(e.send(phone), http.StatusAccepted, "warm-up send to "+phone)
		e.want(e.verify(phone, "000000"), http.StatusUnauthorized, "warm-up verify of "+phone)
	}
	for _, phone := range known {
		e.want(e.send(phone), http.StatusAccepted, "first code to "+phone)
	}
	pastCooldown()
	for _, phone := range known {
		for i := 0; ; i++ {
			d, err := e.svc.phone.Peek(ctx, phone)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				break
			}
			if i == 1000 {
				t.Fatalf("%s still in its cooldown of %v: %+v", phone, e.cfg.Cooldown, d)
			}
			time.Sleep(max(d.RetryAfter, time.Millisecond))
		}
	}

	type call struct {
		phone string
		cmds  []testutil.Command
		r     response
	}
	// run makes the request of kind for phone and records its commands.
	run := func(phone string, do func(string) response) call {
		rec.Reset()
		r := do(phone)
		return call{phone, rec.Commands(), r}
	}
	// compare fails t unless a number of each kind got the same answer for
	// the same work, on keys derived from the number's HMAC.
	compare := func(what string, k, u call) {
		t.Helper()
		// A 202 names the number it was sent to: compare the rest.
		if k.r.status != u.r.status || strings.ReplaceAll(k.r.raw, k.phone, "N") != strings.ReplaceAll(u.r.raw, u.phone, "N") {
			t.Fatalf("%s: a number with codes: %v; a number never seen: %v", what, k.r, u.r)
		}
		for _, h := range []string{"Content-Type", "Cache-Control", "Retry-After"} {
			if k.r.header.Get(h) != u.r.header.Get(h) {
				t.Fatalf("%s: %s %q for a number with codes, %q for one never seen", what, h, k.r.header.Get(h), u.r.header.Get(h))
			}
		}
		if d := diffWork(k.cmds, u.cmds); d != "" {
			t.Fatalf("%s: the Redis work differs (%s)\nnumber with codes:\n\t%s\nnumber never seen:\n\t%s", what, d,
				strings.Join(testutil.Shapes(k.cmds), "\n\t"), strings.Join(testutil.Shapes(u.cmds), "\n\t"))
		}
		for _, c := range []call{k, u} {
			keyed(t, what, e, c.phone, c.cmds)
		}
	}

	send := func(phone string) response { return e.send(phone) }
	for i, phone := range known {
		// Alternate which kind goes first: neither rides on the other.
		var k, u call
		if i%2 == 0 {
			k, u = run(phone, send), run(fresh(), send)
		} else {
			u, k = run(fresh(), send), run(phone, send)
		}
		e.want(k.r, http.StatusAccepted, "second code to "+phone)
		compare(fmt.Sprintf("send %d", i), k, u)
		if i == 0 {
			t.Logf("send, %d round trips for either kind of number:\n\t%s", len(testutil.Shapes(k.cmds)), strings.Join(testutil.Shapes(k.cmds), "\n\t"))
		}
	}

	// Every known number now has a code pending. A pending code is no
	// secret (anyone may have one sent to any number), and a guess while one
	// is outstanding does more work than one without, by design: it counts
	// against the number's daily failures, which no guess without a code
	// does (the stranger-lockout rule). What must not show is that a number
	// has had codes: each known number's code is used, and a known number
	// with no code pending is compared with one never seen.
	for _, phone := range known {
		e.want(e.verify(phone, e.sms.code(t, phone)), http.StatusOK, "the code of "+phone)
	}
	guess := func(phone string) string { return "000000" }
	verify := func(phone string) response { return e.verify(phone, guess(phone)) }
	var k0 call
	for i, phone := range known {
		var k, u call
		if i%2 == 0 {
			k, u = run(phone, verify), run(fresh(), verify)
		} else {
			u, k = run(fresh(), verify), run(phone, verify)
		}
		e.want(k.r, http.StatusUnauthorized, "a guess for "+phone)
		compare(fmt.Sprintf("verify %d", i), k, u)
		if i == 0 {
			k0 = k
			t.Logf("verify, %d round trips for either kind of number:\n\t%s", len(testutil.Shapes(k.cmds)), strings.Join(testutil.Shapes(k.cmds), "\n\t"))
		}
		if !slices.ContainsFunc(k.cmds, isCheck) || !slices.ContainsFunc(u.cmds, isCheck) {
			t.Fatalf("verify %d: check.lua did not run for both kinds of number", i)
		}
	}

	// The control: one more round trip, made after check.lua for a
	// number never seen (the bug, inverted), is told apart.
	client := e.svc.client.(*redis.Client)
	control := oneMoreRoundTrip{client: client, on: &atomic.Bool{}}
	client.AddHook(control)
	control.on.Store(true)
	u := run(fresh(), verify)
	control.on.Store(false)
	if diffWork(k0.cmds, u.cmds) == "" {
		t.Fatalf("a verification with one more round trip looks like one without:\n\t%s", strings.Join(testutil.Shapes(u.cmds), "\n\t"))
	}
}

// diffWork describes how two calls' commands differ in their work (see
// testutil.Command.Shape), or returns "" when they do the same.
func diffWork(a, b []testutil.Command) string {
	sa, sb := testutil.Shapes(a), testutil.Shapes(b)
	if len(sa) != len(sb) {
		return fmt.Sprintf("%d round trips against %d", len(sa), len(sb))
	}
	for i := range sa {
		if sa[i] != sb[i] {
			return fmt.Sprintf("round trip %d: %s against %s", i+1, sa[i], sb[i])
		}
	}
	for _, c := range append(slices.Clone(a), b...) {
		if c.Err != nil {
			return fmt.Sprintf("%s failed: %v", c.Shape(), c.Err)
		}
	}
	return ""
}

// keyed fails t unless every key the commands of a call for phone touch is
// the number's HMAC in some form (the code's key, or a guard's hash of the
// number or of 127.0.0.1), and the number is nowhere in clear.
func keyed(t *testing.T, what string, e *env, phone string, cmds []testutil.Command) {
	t.Helper()
	codeKey := e.svc.codes.key(phone)
	digits := strings.TrimPrefix(phone, "+86")
	sawCode := false
	for _, c := range cmds {
		for _, a := range c.Args {
			if strings.Contains(fmt.Sprint(a), digits) {
				t.Fatalf("%s: the number %s in clear in %v", what, phone, c.Args)
			}
		}
		if c.Script == checkScript.Hash() || (c.Script == "" && len(c.Args) > 1 && strings.HasPrefix(fmt.Sprint(c.Args[1]), "sms:code:")) {
			key := fmt.Sprint(c.Args[1])
			if c.Script != "" {
				key = c.Keys()[0]
			}
			if key != codeKey {
				t.Fatalf("%s: %s on %q; want the code's key of %s, %q", what, c.Shape(), key, phone, codeKey)
			}
			sawCode = true
		}
	}
	if !sawCode {
		t.Fatalf("%s: no command on the code's key of %s", what, phone)
	}
}

// isCheck reports whether c runs check.lua.
func isCheck(c testutil.Command) bool { return c.Script == checkScript.Hash() }

// oneMoreRoundTrip is a go-redis hook that, while on, makes one more round
// trip (a PING) after check.lua: the shape of the bug
// TestEnumerationTiming is to catch.
type oneMoreRoundTrip struct {
	client *redis.Client
	on     *atomic.Bool
}

func (h oneMoreRoundTrip) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h oneMoreRoundTrip) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if args := cmd.Args(); h.on.Load() && len(args) > 1 && (args[1] == checkScript.Hash() || args[1] == checkSrc) {
			h.client.Ping(ctx)
		}
		return err
	}
}

func (h oneMoreRoundTrip) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
