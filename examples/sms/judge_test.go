package main

import (
	"math"
	"testing"
)

// The Wilson bound does not refuse a small honest sample, and refuses a
// sample that is plainly below the bar.
func TestWilsonUpper(t *testing.T) {
	for _, tc := range []struct {
		v, n int64
		want float64
	}{{0, 0, 1}, {0, 5, 0.4345}, {0, 20, 0.1611}, {6, 20, 0.5190}, {17, 20, 0.9476}} {
		if got := wilsonUpper(tc.v, tc.n, 1.96); math.Abs(got-tc.want) > 1e-4 {
			t.Errorf("wilsonUpper(%d, %d) = %.4f; want %.4f", tc.v, tc.n, got, tc.want)
		}
	}
}

// A send is judged on its prefix, and, unless its prefix keeps converting,
// on its group and country; the bar follows the country's usual rate.
func TestJudge(t *testing.T) {
	p := defaultPools().policy()
	usual := tally{Sent: 100, Verified: 85} // bar 0.425
	for _, tc := range []struct {
		name     string
		v        poolView
		unproven bool
		scope    string
		rule     string
	}{
		{"a fresh prefix, a quiet country", poolView{country: usual}, true, "", ""},
		{"a proven prefix in a country pumped", poolView{country: usual, prefixDay: tally{Sent: 5, Verified: 4},
			unproven: tally{Sent: 30}}, false, "", ""},
		{"an unproven prefix in a country pumped", poolView{country: usual, unproven: tally{Sent: 30}}, true, "country", rulePooled},
		{"codes open: held", poolView{country: usual, group: tally{Sent: 8, Open: 8}}, true, "group", rulePooledPending},
		{"30% in a country at 85%", poolView{country: usual, prefix: tally{Sent: 80, Verified: 24}}, true, "prefix", rulePooled},
		{"30% at the fixed bar alone", poolView{prefix: tally{Sent: 80, Verified: 24}}, true, "", ""},
		{"velocity", poolView{country: usual, recent: 61, older: 220}, true, "country", ruleVelocity},
		{"a known prefix, nothing sent today, a country pumped", poolView{country: usual, known: true,
			unproven: tally{Sent: 30}}, false, "", ""},
		{"a known prefix whose code today was not used", poolView{country: usual, known: true,
			prefixDay: tally{Sent: 1}, unproven: tally{Sent: 30}}, true, "country", rulePooled},
	} {
		unproven, r := p.judge(tc.v)
		scope, rule := "", ""
		if r != nil {
			scope, rule = r.Scope, r.Rule
		}
		if unproven != tc.unproven || scope != tc.scope || rule != tc.rule {
			t.Errorf("%s: unproven %v, %s %s; want %v, %q %q", tc.name, unproven, scope, rule, tc.unproven, tc.scope, tc.rule)
		}
	}
}
