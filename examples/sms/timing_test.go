package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// timings are the latencies of one kind of request.
type timings []time.Duration

func (ts timings) median() time.Duration {
	s := slices.Clone(ts)
	slices.Sort(s)
	return s[len(s)/2]
}

// A number that has had codes and a number never seen get the same answer
// to a send and to a wrong code, and in the same time: over 1,000 requests
// of each kind, interleaved in random order, their medians differ by less
// than half what one more Redis round trip costs. That cost is measured in
// the same run, by a third kind of request that makes one (see
// oneMoreRoundTrip): a bound in microseconds would be too tight for a
// loaded 2-core machine under -race or too loose to catch a round trip on
// a fast one; this one moves with the machine. On a loaded machine the
// medians of one thousand can still land apart by chance: then another
// thousand of each are measured, twice at most, and the medians of all
// decide (an extra round trip stays one however many are measured).
func TestEnumerationTiming(t *testing.T) {
	if testing.Short() {
		t.Skip("7,000 requests")
	}
	srv := testutil.StartServer(t) // the real thing: a round trip to a redis-server
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	client.AddHook(oneMoreRoundTrip{client})
	const cooldown = time.Second
	e := newEnvOn(t, client, func(c *Config) {
		c.Cooldown = cooldown
		c.IPHourly, c.IPDaily = 100_000, 100_000
		c.Timeout = 10 * time.Second // a stall under load must not turn into a 503
	})
	handler := e.svc.Handler()
	extra := *e // the service, making one more round trip per request
	extra.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handler.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), extraRoundTrip{}, true)))
	}))
	t.Cleanup(extra.srv.Close)

	const n, batches = 1000, 3
	// The known numbers are phoneN(0) to phoneN(n-1); never seen ones are
	// taken from 1,000,000 on, a fresh one for every request.
	lastCode := make([]time.Time, n)
	for i := range n {
		lastCode[i] = time.Now()
		e.want(e.send(phoneN(i)), http.StatusAccepted, fmt.Sprintf("first code to number %d", i))
	}
	next := 1_000_000
	fresh := func() string { next++; return phoneN(next) }

	rng := rand.New(rand.NewPCG(9, 9))
	type kind struct {
		name  string
		do    func(i int) response // i: the known number's index
		ready func(i int)          // if set, runs before do, untimed
		ts    timings
	}
	// measure runs the kinds n times each, in a random order every round,
	// up to batches times; the answers of the first two kinds must be alike.
	measure := func(what string, kinds []*kind) {
		t.Helper()
		for batch := 1; ; batch++ {
			for i := range n {
				var rs [3]response
				for _, k := range rng.Perm(len(kinds)) {
					if kinds[k].ready != nil {
						kinds[k].ready(i)
					}
					start := time.Now()
					rs[k] = kinds[k].do(i)
					kinds[k].ts = append(kinds[k].ts, time.Since(start))
				}
				if rs[0].status != rs[1].status || rs[0].raw != rs[1].raw {
					t.Fatalf("%s %d: %s number: %v; %s: %v", what, i, kinds[0].name, rs[0], kinds[1].name, rs[1])
				}
				for _, h := range []string{"Content-Type", "Cache-Control", "Retry-After"} {
					if rs[0].header.Get(h) != rs[1].header.Get(h) {
						t.Fatalf("%s %d: %s %q for a %s number, %q for a %s one", what, i, h,
							rs[0].header.Get(h), kinds[0].name, rs[1].header.Get(h), kinds[1].name)
					}
				}
			}
			known, unknown, slower := kinds[0].ts.median(), kinds[1].ts.median(), kinds[2].ts.median()
			roundTrip, d := slower-unknown, (known - unknown).Abs()
			t.Logf("%s: medians of %d: known %v, never seen %v (%+.2f round trips), never seen with one more round trip %v (+%v)",
				what, len(kinds[0].ts), known, unknown, float64(known-unknown)/float64(roundTrip), slower, roundTrip)
			switch {
			case roundTrip > 0 && d < roundTrip/2:
				return
			case batch < batches:
				continue
			case roundTrip <= 0:
				t.Fatalf("%s: one more round trip made no difference to the median (%v): this machine cannot tell a round trip from noise", what, roundTrip)
			default:
				t.Errorf("%s: medians of known and never-seen numbers differ by %v; want less than half a round trip (%v)", what, d, roundTrip/2)
				return
			}
		}
	}

	want202 := func(e *env, phone string) response {
		r := e.send(phone)
		e.want(r, http.StatusAccepted, "send to "+phone)
		return r
	}
	measure("send", []*kind{
		{name: "known", do: func(i int) response { lastCode[i] = time.Now(); return want202(e, phoneN(i)) },
			// Past the cooldown of the last code: a wait hardly ever
			// needed, since a round takes longer than a first code.
			ready: func(i int) { time.Sleep(time.Until(lastCode[i].Add(cooldown))) }},
		{name: "never seen", do: func(int) response { return want202(e, fresh()) }},
		{name: "extra round trip", do: func(int) response { return want202(&extra, fresh()) }},
	})

	// Every known number now has a code pending: guess one that is wrong
	// for sure. The numbers never seen have no code, any guess is wrong.
	codes := map[string]string{}
	for _, m := range e.sms.messages() {
		codes[m.to] = codeRE.FindStringSubmatch(m.text)[1] // the last one wins
	}
	want401 := func(e *env, phone string) response {
		guess := "000000"
		if c, ok := codes[phone]; ok {
			guess = wrong(c, 0)
		}
		r := e.verify(phone, guess)
		e.want(r, http.StatusUnauthorized, "wrong code for "+phone)
		return r
	}
	measure("verify", []*kind{
		{name: "known", do: func(i int) response { return want401(e, phoneN(i)) }},
		{name: "never seen", do: func(int) response { return want401(e, fresh()) }},
		{name: "extra round trip", do: func(int) response { return want401(&extra, fresh()) }},
	})
}

// extraRoundTrip marks the context of a request that makes one more round
// trip.
type extraRoundTrip struct{}

// oneMoreRoundTrip is a go-redis hook that, in a request marked with
// extraRoundTrip, makes one more round trip (a PING) after the code's
// command: the code's MULTI/EXEC in a send, the attempt script in a
// verification. That is the bug the timing test is to catch, in the place
// where it would be.
type oneMoreRoundTrip struct{ client *redis.Client }

func (h oneMoreRoundTrip) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h oneMoreRoundTrip) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if args := cmd.Args(); ctx.Value(extraRoundTrip{}) != nil && len(args) > 1 &&
			(args[1] == attemptScript.Hash() || args[1] == attemptSrc) {
			h.client.Ping(ctx)
		}
		return err
	}
}

func (h oneMoreRoundTrip) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if ctx.Value(extraRoundTrip{}) != nil && slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return c.Name() == "hset" }) {
			h.client.Ping(ctx)
		}
		return err
	}
}
