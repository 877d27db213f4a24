package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// conversionOn turns the conversion guard on with its defaults (testConfig
// turns it off), and the per-IP limits off: the tests send from 50
// addresses (X-Forwarded-For) and verify from one.
func conversionOn(c *Config) {
	c.Conversion = defaultConversion()
	c.TrustProxy = true
	noIPLimits(c)
}

// judging5 judges the last 5 sends, of which 1 must be verified.
func judging5(c *Config) { c.Conversion.Sends = 5 }

// clock moves the miniredis of e: its TIME (which the guards read) and its
// TTLs (the codes') together.
type clock struct {
	e   *env
	now time.Duration // since t0
}

func (c *clock) to(d time.Duration) {
	c.e.t.Helper()
	if d < c.now {
		c.e.t.Fatalf("clock moved back from %v to %v", c.now, d)
	}
	c.e.b.Mini.FastForward(d - c.now)
	c.now = d
	c.e.at(d)
}

// from is the X-Forwarded-For header of the i-th of 50 addresses.
func from(i int) []string { return []string{"X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i%50)} }

// wantConversion fails the test unless r is the conversion guard's 429 of
// rule, with Retry-After wait.
func (e *env) wantConversion(r response, rule string, wait int64, what string) {
	e.t.Helper()
	e.want(r, http.StatusTooManyRequests, what)
	if r.body.Scope != "prefix" || r.body.Rule != rule {
		e.t.Fatalf("%s = %v; want scope prefix, rule %s", what, r, rule)
	}
	if got := e.retryAfter(r, what); got != wait {
		e.t.Fatalf("%s: retry after %d s; want %d", what, got, wait)
	}
}

// Codes within their TTL are not failures: a prefix whose last 5 codes are
// all outstanding is held, not paused, until they expire; it is paused when
// the 5th expires, not a second before; a send it refuses takes nothing
// from any guard and sends nothing; the pause is logged and counted, and
// ends on time.
func TestConversionJudgesExpiredCodes(t *testing.T) {
	e := newEnv(t, conversionOn, judging5)
	c := &clock{e: e}
	for i := range 5 { // +86 139 00 00000i, prefix +8613900, at 0, 10, ..., 40 s
		c.to(time.Duration(i) * 10 * time.Second)
		e.want(e.send(phoneN(i), from(i)...), http.StatusAccepted, fmt.Sprintf("send %d", i+1))
	}
	c.to(50 * time.Second)
	before := e.ledger(phoneN(5), "198.51.100.5")
	r := e.send(phoneN(5), from(5)...)
	e.wantConversion(r, ruleConversionPending, 250, "6th send, 5 codes outstanding") // the first expires at 300 s
	e.unchanged("a send the conversion guard held", before, e.ledger(phoneN(5), "198.51.100.5"))

	c.to(339 * time.Second) // 4 expired, the 5th (sent at 40 s) lives 1 s more
	e.wantConversion(e.send(phoneN(5), from(5)...), ruleConversionPending, 1, "6th send, 1 code outstanding")
	c.to(340 * time.Second)
	before = e.ledger(phoneN(5), "198.51.100.5")
	e.wantConversion(e.send(phoneN(5), from(5)...), ruleConversion, 3600, "6th send, the 5 codes expired")
	e.wantConversion(e.send(phoneN(6), from(6)...), ruleConversion, 3600, "7th send, paused")
	e.unchanged("a send to a paused prefix", before, e.ledger(phoneN(5), "198.51.100.5"))
	if n := len(e.sms.messages()); n != 5 {
		t.Fatalf("%d messages; want 5", n)
	}
	e.want(e.send(number, from(9)...), http.StatusAccepted, "a send to another prefix")

	logs := e.logs.String()
	if want := `msg="prefix paused: its codes are not verified" prefix=+8613900 verified=0 judged=5 of=5 for=1h0m0s`; strings.Count(logs, want) != 1 {
		t.Fatalf("the logs lack the pause, once: %s\n%s", want, logs)
	}
	for name, want := range map[string]float64{
		`sms_conversion_pauses_total`:                                     1,
		`sms_denials_total{guard="conversion",rule="conversion"}`:         2,
		`sms_denials_total{guard="conversion",rule="conversion-pending"}`: 2,
		`sms_sends_total{result="denied"}`:                                4,
	} {
		n, labels, _ := strings.Cut(strings.TrimSuffix(name, "}"), "{")
		if got := e.metric(n, labels); got != want {
			t.Errorf("%s = %v; want %v", name, got, want)
		}
	}

	c.to(340*time.Second + time.Hour - time.Millisecond)
	e.wantConversion(e.send(phoneN(5), from(5)...), ruleConversion, 1, "a send 1 ms before the pause ends")
	c.to(340*time.Second + time.Hour)
	e.want(e.send(phoneN(5), from(5)...), http.StatusAccepted, "a send when the pause ends")
}

// A verified code counts at once: a held prefix is released by it.
func TestConversionVerifiedReleases(t *testing.T) {
	e := newEnv(t, conversionOn, judging5)
	c := &clock{e: e}
	for i := range 5 {
		c.to(time.Duration(i) * 10 * time.Second)
		e.want(e.send(phoneN(i), from(i)...), http.StatusAccepted, fmt.Sprintf("send %d", i+1))
	}
	c.to(60 * time.Second)
	e.wantConversion(e.send(phoneN(5), from(5)...), ruleConversionPending, 240, "6th send, 5 codes outstanding")
	e.want(e.verify(phoneN(3), e.sms.code(t, phoneN(3))), http.StatusOK, "verify the 4th code")
	e.want(e.send(phoneN(5), from(5)...), http.StatusAccepted, "6th send, a code of 5 verified")
	// Long after, the window is sends 2 to 6, one verified: the prefix
	// converts as it must (1 of 5), and is not paused.
	c.to(time.Hour)
	e.want(e.send(phoneN(6), from(6)...), http.StatusAccepted, "7th send, an hour later")
}

// A send the provider reports undelivered counts as not converted at once;
// resume ends a pause and starts the prefix afresh.
func TestConversionUndeliveredAndResume(t *testing.T) {
	e := newEnv(t, conversionOn, judging5)
	ctx := context.Background()
	if ok, err := e.svc.undelivered(ctx, phoneN(0)); ok || err != nil {
		t.Fatalf("undelivered before any send = %v, %v; want false", ok, err)
	}
	for i := range 5 {
		e.want(e.send(phoneN(i), from(i)...), http.StatusAccepted, fmt.Sprintf("send %d", i+1))
		if ok, err := e.svc.undelivered(ctx, phoneN(i)); !ok || err != nil {
			t.Fatalf("undelivered %d = %v, %v; want true", i+1, ok, err)
		}
	}
	e.wantConversion(e.send(phoneN(5), from(5)...), ruleConversion, 3600, "6th send, 5 undelivered")
	if ok, err := e.svc.conversion.resume(ctx, "+8613900"); !ok || err != nil {
		t.Fatalf("resume = %v, %v; want true", ok, err)
	}
	e.want(e.send(phoneN(5), from(5)...), http.StatusAccepted, "6th send, resumed")
	if ok, err := e.svc.conversion.resume(ctx, "+8613900"); ok || err != nil {
		t.Fatalf("resume again = %v, %v; want false (not paused)", ok, err)
	}
	// A verified code stays verified whatever is reported after it.
	e.want(e.verify(phoneN(5), e.sms.code(t, phoneN(5))), http.StatusOK, "verify the 6th code")
	if ok, err := e.svc.undelivered(ctx, phoneN(5)); ok || err != nil {
		t.Fatalf("undelivered after a verification = %v, %v; want false", ok, err)
	}
}

// Real users: a prefix whose codes are 80% verified, a few seconds to two
// minutes after they are sent, is never refused, over hours of sends at
// random times (seeded, replayable).
func TestConversionRealUsersNeverPaused(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	e := newEnv(t, conversionOn)
	c := &clock{e: e}
	type event struct {
		at     time.Duration
		i      int
		verify bool
	}
	var events []event
	var at time.Duration
	const sends = 400
	for i := range sends { // one every 1 to 59 s: 60 to 70 an hour
		at += time.Duration(1+rng.IntN(59)) * time.Second
		events = append(events, event{at, i, false})
		if rng.IntN(5) > 0 {
			events = append(events, event{at + time.Duration(5+rng.IntN(115))*time.Second, i, true})
		}
	}
	slices.SortStableFunc(events, func(a, b event) int { return int(a.at - b.at) })
	verified := 0
	for _, ev := range events {
		c.to(ev.at)
		if ev.verify {
			e.want(e.verify(phoneN(ev.i), e.sms.code(t, phoneN(ev.i))), http.StatusOK, fmt.Sprintf("verify %d at %v", ev.i, ev.at))
			verified++
			continue
		}
		e.want(e.send(phoneN(ev.i), from(ev.i)...), http.StatusAccepted, fmt.Sprintf("send %d at %v (seed %d)", ev.i, ev.at, seed))
	}
	t.Logf("FIGURE real users | %d sends over %v, %d verified: none refused", sends, at.Round(time.Minute), verified)
}

// The state is bounded, expires, and shares one hash slot per prefix; a
// send another guard denies leaves no record; the pause record holds the
// figures, and expires with the pause.
func TestConversionState(t *testing.T) {
	onBackends(t, []func(*Config){conversionOn, judging5}, func(t *testing.T, e *env) {
		ctx := context.Background()
		for i := range 30 {
			e.want(e.send(phoneN(i), from(i)...), http.StatusAccepted, fmt.Sprintf("send %d", i+1))
			e.want(e.verify(phoneN(i), e.sms.code(t, phoneN(i))), http.StatusOK, fmt.Sprintf("verify %d", i+1))
		}
		e.want(e.send(phoneN(29), from(29)...), http.StatusTooManyRequests, "a send the cooldown denies")
		keys := e.svc.conversion.keys("+8613900")
		// The window is cut to the last 5 before each decision (the denied
		// send's); the record of the send that was denied after it was
		// taken back.
		ids := e.svc.client.ZRange(ctx, keys[0], 0, -1).Val()
		var tags []string
		for _, id := range ids {
			tags = append(tags, id[:11])
		}
		var want []string
		for i := 25; i < 30; i++ {
			want = append(want, e.svc.conversion.tag(phoneN(i)))
		}
		if !slices.Equal(tags, want) {
			t.Fatalf("the window holds sends to %v; want those to the last 5 numbers, %v", tags, want)
		}
		if n := e.svc.client.HLen(ctx, keys[1]).Val(); n != 5 {
			t.Fatalf("%d outcomes kept; want 5", n)
		}
		for i := range 5 {
			e.want(e.send(phoneN(100+i), from(i)...), http.StatusAccepted, fmt.Sprintf("send %d", 31+i))
			if _, err := e.svc.undelivered(ctx, phoneN(100+i)); err != nil {
				t.Fatal(err)
			}
		}
		e.wantConversion(e.send(phoneN(105), from(5)...), ruleConversion, 3600, "a send after 5 undelivered")
		pause, err := e.svc.client.HGetAll(ctx, keys[2]).Result()
		if err != nil {
			t.Fatal(err)
		}
		if pause["prefix"] != "+8613900" || pause["verified"] != "0" || pause["judged"] != "5" {
			t.Fatalf("pause record %v; want prefix +8613900, verified 0 of 5 judged", pause)
		}
		if ttl := e.svc.client.PTTL(ctx, keys[2]).Val(); ttl <= 59*time.Minute || ttl > time.Hour {
			t.Fatalf("the pause's TTL is %v; want an hour", ttl)
		}
		all, err := e.svc.client.Keys(ctx, "sms:conv:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		slot := regexp.MustCompile(`\{[^}]*\}`)
		for _, k := range all {
			if k != e.svc.conversion.indexKey() && slot.FindString(k) != slot.FindString(keys[2]) { // the index is one key of its own
				t.Errorf("key %s: another hash tag than %s", k, keys[2])
			}
			if ttl := e.svc.client.PTTL(ctx, k).Val(); ttl <= 0 {
				t.Errorf("key %s has no TTL (%v)", k, ttl)
			}
		}
		if stray, _ := e.strayKeys(); len(stray) > 0 {
			t.Fatalf("keys of no known shape: %v", stray)
		}
	})
}

// The reply of the send that pauses a prefix is lost: go-redis runs the
// script again, and the retry answers as the first run, so the pause is
// logged and counted once; a send whose reply is lost is recorded once.
func TestConversionReplyLost(t *testing.T) {
	onLostReply(t, []func(*Config){conversionOn, judging5}, func(t *testing.T, e *env, fault *testutil.LostReply, admin *redis.Client) {
		ctx := context.Background()
		fault.Drop(testutil.ScriptHash(conversionScript.Hash()))
		e.want(e.send(phoneN(0), from(0)...), http.StatusAccepted, "send 1, its reply lost")
		fault.ExpectDropped(t, 1)
		if n := admin.ZCard(ctx, e.svc.conversion.keys("+8613900")[0]).Val(); n != 1 {
			t.Fatalf("%d sends recorded; want 1", n)
		}
		for i := range 5 {
			if i > 0 {
				e.want(e.send(phoneN(i), from(i)...), http.StatusAccepted, fmt.Sprintf("send %d", i+1))
			}
			if _, err := e.svc.undelivered(ctx, phoneN(i)); err != nil {
				t.Fatal(err)
			}
		}
		fault.Drop(testutil.ScriptHash(conversionScript.Hash()))
		e.wantConversion(e.send(phoneN(5), from(5)...), ruleConversion, 3600, "the send that pauses, its reply lost")
		fault.ExpectDropped(t, 2)
		if got := e.metric("sms_conversion_pauses_total", ""); got != 1 {
			t.Fatalf("%v pauses counted; want 1", got)
		}
		if n := strings.Count(e.logs.String(), "prefix paused"); n != 1 {
			t.Fatalf("the pause logged %d times; want 1:\n%s", n, e.logs)
		}
	})
}

// Any of the three settings at 0 turns the guard off: nothing is refused
// and nothing is stored.
func TestConversionOff(t *testing.T) {
	for name, off := range map[string]func(*Config){
		"min-conversion 0":   func(c *Config) { c.Conversion.MinRate = 0 },
		"conversion-sends 0": func(c *Config) { c.Conversion.Sends = 0 },
		"conversion-pause 0": func(c *Config) { c.Conversion.Pause = 0 },
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, conversionOn, off)
			c := &clock{e: e}
			for i := range 30 {
				c.to(time.Duration(i) * time.Minute)
				e.want(e.send(phoneN(i), from(i)...), http.StatusAccepted, fmt.Sprintf("send %d, none verified", i+1))
			}
			if keys := e.b.Mini.Keys(); slices.ContainsFunc(keys, func(k string) bool { return strings.HasPrefix(k, "sms:conv:") }) {
				t.Fatalf("conversion keys stored: %v", keys)
			}
		})
	}
}

// The settings: bounds, flags, and the count of verified codes a window
// needs, exact for decimal fractions.
func TestConversionConfig(t *testing.T) {
	for _, tc := range []struct {
		rate  float64
		sends int64
		need  int64
	}{{0.2, 20, 4}, {0.7, 10, 7}, {0.21, 20, 5}, {0.25, 20, 5}, {1, 20, 20}, {0.05, 20, 1}, {0.000001, 20, 1}, {0.3, 10, 3}, {0.1, 1000, 100}} {
		if got := (ConversionConfig{MinRate: tc.rate, Sends: tc.sends}).need(); got != tc.need {
			t.Errorf("need(%v of %d) = %d; want %d", tc.rate, tc.sends, got, tc.need)
		}
	}
	for _, bad := range []ConversionConfig{{MinRate: -0.1}, {MinRate: 1.01}, {MinRate: math.NaN()}, {Sends: -1}, {Sends: 1001}, {Pause: -time.Second}, {Pause: 500 * time.Millisecond}} {
		cfg := testConfig()
		cfg.Conversion = bad
		if _, err := NewService(nil, cfg, &capture{}, nil); err == nil || !strings.Contains(err.Error(), "conversion") {
			t.Errorf("NewService with %+v = %v; want the conversion flags' error", bad, err)
		}
	}
	fl := flag.NewFlagSet("sms", flag.ContinueOnError)
	fl.SetOutput(io.Discard)
	c := defaultConversion()
	conversionFlags(fl, &c)
	if err := fl.Parse([]string{"-min-conversion", "0.5", "-conversion-sends", "40", "-conversion-pause", "2h"}); err != nil {
		t.Fatal(err)
	}
	if want := (ConversionConfig{MinRate: 0.5, Sends: 40, Pause: 2 * time.Hour}); c != want {
		t.Fatalf("flags read %+v; want %+v", c, want)
	}
}

// On a Redis Cluster: a prefix's keys share a slot, so each script runs
// (a CROSSSLOT error would answer 503), and the guard pauses and resumes
// as on one server.
func TestConversionCluster(t *testing.T) {
	c := testutil.Cluster(t)
	e := newEnvOn(t, c.Client(t), conversionOn, judging5)
	ctx := context.Background()
	phone := func(i int) string { return fmt.Sprintf("+86136%08d", i) }
	for i := range 5 {
		e.want(e.send(phone(i), from(i)...), http.StatusAccepted, fmt.Sprintf("send %d", i+1))
		if ok, err := e.svc.undelivered(ctx, phone(i)); !ok || err != nil {
			t.Fatalf("undelivered %d = %v, %v; want true", i+1, ok, err)
		}
	}
	e.wantConversion(e.send(phone(5), from(5)...), ruleConversion, 3600, "6th send, 5 undelivered")
	if ok, err := e.svc.conversion.resume(ctx, "+8613600"); !ok || err != nil {
		t.Fatalf("resume = %v, %v; want true", ok, err)
	}
	e.want(e.send(phone(5), from(5)...), http.StatusAccepted, "6th send, resumed")
	e.want(e.verify(phone(5), e.sms.code(t, phone(5))), http.StatusOK, "verify the 6th code")
}
