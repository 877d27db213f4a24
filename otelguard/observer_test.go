package otelguard_test

import (
	"context"
	"errors"
	"testing"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/otelguard"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Two calls within the limit and one past it: two allowed decisions without
// a rule, one denied by the rule, each with its guard's prefix, and one
// latency per decision.
func TestObserverCountsDecisions(t *testing.T) {
	e := newEnv(t)
	g := e.guard(t, guard.WithPrefix("sms:phone:"))
	ctx := context.Background()
	for i, want := range []bool{true, true, false} {
		d, err := g.Allow(ctx, phone)
		if err != nil || d.Allowed != want {
			t.Fatalf("call %d: allowed %v, %v; want %v", i, d.Allowed, err, want)
		}
	}

	rm := e.collect(t)
	got := map[string]int64{}
	for _, p := range counter(t, rm, otelguard.MetricDecisions) {
		a := attrs(p.Attributes)
		if a["funnelguard.prefix"] != "sms:phone:" || a["funnelguard.degraded"] != "false" ||
			a["funnelguard.shadow"] != "false" || a["error.type"] != "" {
			t.Errorf("decision attributes %v", a)
		}
		got[a["funnelguard.outcome"]+"/"+a["funnelguard.rule"]] += p.Value
	}
	want := map[string]int64{"allowed/": 2, "denied/" + twoAnHour.Name: 1}
	if len(got) != len(want) || got["allowed/"] != 2 || got["denied/"+twoAnHour.Name] != 1 {
		t.Errorf("decisions %v, want %v", got, want)
	}

	var n uint64
	for _, p := range histogram(t, rm, otelguard.MetricDecisionDuration) {
		n += p.Count
		if p.Sum <= 0 {
			t.Errorf("latency sum %v for %v", p.Sum, attrs(p.Attributes))
		}
	}
	if n != 3 {
		t.Errorf("latency count %d, want 3 (one per decision)", n)
	}
	for _, name := range []string{otelguard.MetricDegraded, otelguard.MetricFailOpen} {
		if hasMetric(rm, name) {
			t.Errorf("%s recorded without an outage", name)
		}
	}
}

// A guard in shadow mode: its decisions say so, and an empty Prefix is
// reported as the one the guard uses.
func TestObserverShadowAndDefaultPrefix(t *testing.T) {
	e := newEnv(t)
	g := e.guard(t, guard.WithShadow())
	if _, err := g.Allow(context.Background(), phone); err != nil {
		t.Fatal(err)
	}
	pts := counter(t, e.collect(t), otelguard.MetricDecisions)
	if len(pts) != 1 {
		t.Fatalf("%d decision series, want 1", len(pts))
	}
	a := attrs(pts[0].Attributes)
	if a["funnelguard.shadow"] != "true" || a["funnelguard.prefix"] != guard.DefaultPrefix {
		t.Errorf("attributes %v, want shadow true and prefix %q", a, guard.DefaultPrefix)
	}
}

// With Redis gone, FailOpen admits with the rules in this process: a
// degraded decision and a fail-open admission. FailClosed denies: degraded,
// an error, and no fail-open admission.
func TestObserverOutage(t *testing.T) {
	for _, tc := range []struct {
		mode                       guard.FailureMode
		allowed                    bool
		outcome                    string
		wantDegraded, wantFailOpen int64
	}{
		{guard.FailOpen, true, "allowed", 1, 1},
		{guard.FailClosed, false, "error", 1, 0},
	} {
		t.Run(tc.outcome, func(t *testing.T) {
			e := newEnv(t)
			g := e.guard(t, guard.WithPrefix("sms:ip:"), guard.WithOnError(tc.mode))
			e.mr.Close()
			d, err := g.Allow(context.Background(), phone)
			if !errors.Is(err, guard.ErrUnavailable) || d.Allowed != tc.allowed || !d.Degraded {
				t.Fatalf("decision %+v, %v; want allowed %v, degraded, ErrUnavailable", d, err, tc.allowed)
			}

			rm := e.collect(t)
			pts := counter(t, rm, otelguard.MetricDecisions)
			if len(pts) != 1 {
				t.Fatalf("%d decision series, want 1", len(pts))
			}
			a := attrs(pts[0].Attributes)
			if a["funnelguard.outcome"] != tc.outcome || a["funnelguard.degraded"] != "true" || a["error.type"] != "unavailable" {
				t.Errorf("decision attributes %v", a)
			}
			if got := total(t, rm, otelguard.MetricDegraded); got != tc.wantDegraded {
				t.Errorf("degraded %d, want %d", got, tc.wantDegraded)
			}
			if got := total(t, rm, otelguard.MetricFailOpen); got != tc.wantFailOpen {
				t.Errorf("fail-open admissions %d, want %d", got, tc.wantFailOpen)
			}
		})
	}
}

// total is the sum of the counter name over its series; 0 when it has none.
func total(t *testing.T, rm metricdata.ResourceMetrics, name string) int64 {
	t.Helper()
	if !hasMetric(rm, name) {
		return 0
	}
	var n int64
	for _, p := range counter(t, rm, name) {
		n += p.Value
	}
	return n
}

func TestNewObserverNilProvider(t *testing.T) {
	if _, err := otelguard.NewObserver(nil); !errors.Is(err, otelguard.ErrNilProvider) {
		t.Errorf("NewObserver(nil): %v", err)
	}
}

// A guard with plans: each decision names its key's plan; a key without
// one is an error of type no_plan.
func TestObserverPlans(t *testing.T) {
	e := newEnv(t)
	g := e.guard(t,
		guard.WithPlans(map[string][]funnel.Rule{"pro": {twoAnHour}}, func(_ context.Context, key string) (string, error) {
			if key == phone {
				return "pro", nil
			}
			return "", errors.New("unknown tenant")
		}),
	)
	ctx := context.Background()
	if d, err := g.Allow(ctx, phone); err != nil || !d.Allowed {
		t.Fatalf("Allow on pro: %+v, %v", d, err)
	}
	if _, err := g.Allow(ctx, "+8613800138001"); !errors.Is(err, guard.ErrPlan) {
		t.Fatalf("Allow without a plan: %v; want ErrPlan", err)
	}
	got := map[string]int64{}
	for _, p := range counter(t, e.collect(t), otelguard.MetricDecisions) {
		a := attrs(p.Attributes)
		got[a["funnelguard.outcome"]+"/"+a["funnelguard.plan"]+"/"+a["error.type"]] += p.Value
	}
	if got["allowed/pro/"] != 1 || got["error//no_plan"] != 1 || len(got) != 2 {
		t.Errorf("decisions by outcome/plan/error.type %v; want allowed/pro/ 1 and error//no_plan 1", got)
	}
}
