package funnel_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
)

// A Local decides exactly like the rational model, step by step on explicit
// times: random rules, random gaps, random n, all or nothing.
func TestLocalMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for round := range 200 {
		rules := []funnel.Rule{
			{Name: "a", Capacity: 1 + rng.Int64N(5), Leak: 1 + rng.Int64N(3), Per: time.Duration(1+rng.Int64N(1000)) * time.Millisecond},
			{Name: "b", Capacity: 1 + rng.Int64N(20), Leak: 1 + rng.Int64N(7), Per: time.Duration(1+rng.Int64N(60)) * time.Second},
		}
		most := min(rules[0].Capacity, rules[1].Capacity)
		l := funnel.NewLocal(0)
		base := time.Now()
		model := newRefKey(rules)
		var now int64 // µs since base
		for step := range 100 {
			now += rng.Int64N(400_000)
			n := 1 + rng.Int64N(most)
			res, err := l.AllowN(base.Add(time.Duration(now)*time.Microsecond), "k", n, rules...)
			if err != nil {
				t.Fatalf("round %d step %d: %v", round, step, err)
			}
			want := model.Admits(now, n)
			if res.Allowed != want {
				t.Fatalf("round %d step %d (t=%dµs, n=%d, %+v): Allowed = %v, model says %v", round, step, now, n, rules, res.Allowed, want)
			}
			if want {
				model.Take(now, n)
				continue
			}
			_, wait := model.Waits(now, n)
			if got := res.RetryAfter; got != time.Duration(wait)*time.Microsecond {
				t.Fatalf("round %d step %d: RetryAfter = %v, model says %dµs", round, step, got, wait)
			}
		}
	}
}

// AtMost's promise holds for a Local too: never more than n in any window.
func TestLocalAtMostBound(t *testing.T) {
	const n, window = 3, time.Second
	l := funnel.NewLocal(0)
	base := time.Now()
	var admitted []time.Duration
	for at := time.Duration(0); at < 10*window; at += 7 * time.Millisecond {
		if res, err := l.AllowN(base.Add(at), "k", 1, funnel.AtMost(n, window)); err != nil {
			t.Fatal(err)
		} else if res.Allowed {
			admitted = append(admitted, at)
		}
	}
	for i := range admitted {
		in := 0
		for _, at := range admitted[i:] {
			if at < admitted[i]+window {
				in++
			}
		}
		if in > n {
			t.Fatalf("%d admitted in the window from %v: %v", in, admitted[i], admitted)
		}
	}
	// A burst of n, then one per window: n + 9 in 10 windows.
	if len(admitted) != n+9 {
		t.Fatalf("%d admitted in 10 windows, want %d: %v", len(admitted), n+9, admitted)
	}
}

// A Local remembers at most its bound of keys, however many it sees.
func TestLocalBounded(t *testing.T) {
	const most = 1000
	l := funnel.NewLocal(most)
	rule := funnel.AtMost(1, time.Hour)
	for i := range 100 * most {
		if _, err := l.Allow(fmt.Sprint("k", i), rule); err != nil {
			t.Fatal(err)
		}
		if l.Len() > most {
			t.Fatalf("%d keys remembered after %d, bound %d", l.Len(), i+1, most)
		}
	}
	// The newest keys are still remembered: a repeat is denied.
	if res, _ := l.Allow(fmt.Sprint("k", 100*most-1), rule); res.Allowed {
		t.Fatal("the newest key was forgotten")
	}
}

func TestLocalBadInput(t *testing.T) {
	l := funnel.NewLocal(10)
	good := funnel.AtMost(2, time.Minute)
	cases := []struct {
		key   string
		n     int64
		rules []funnel.Rule
		want  error
	}{
		{"", 1, []funnel.Rule{good}, funnel.ErrInvalidKey},
		{string(make([]byte, funnel.MaxKeyLen+1)), 1, []funnel.Rule{good}, funnel.ErrInvalidKey},
		{"k", 0, []funnel.Rule{good}, funnel.ErrInvalidN},
		{"k", 3, []funnel.Rule{good}, funnel.ErrInvalidN},
		{"k", 1, nil, funnel.ErrInvalidRule},
		{"k", 1, []funnel.Rule{{Name: "x", Capacity: 1, Leak: 0, Per: time.Second}}, funnel.ErrInvalidRule},
		{"k", 1, []funnel.Rule{good, good}, funnel.ErrInvalidRule},
	}
	for _, c := range cases {
		if _, err := l.AllowN(time.Now(), c.key, c.n, c.rules...); !errors.Is(err, c.want) {
			t.Errorf("AllowN(%.10q, %d, %d rules) = %v, want %v", c.key, c.n, len(c.rules), err, c.want)
		}
	}
	if l.Len() != 0 {
		t.Fatalf("bad input left %d keys", l.Len())
	}
}
