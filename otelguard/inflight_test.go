package otelguard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/otelguard"
)

// A guard under InFlight: the Observer records each admitted call's wait
// for its key's permit in MetricSemaphoreWait (ok, or not_obtained for
// ErrBusy), and counts a busy call as an error of type busy, not as an
// admission.
func TestObserverInFlightPermit(t *testing.T) {
	e := newEnv(t)
	g := e.guard(t, guard.WithPrefix("api:export:"), guard.WithInFlight(1), guard.WithTimeout(300*time.Millisecond))
	ctx := context.Background()
	held, err := g.Enter(ctx, phone, 1)
	if err != nil || !held.Admitted() {
		t.Fatalf("Enter: %+v, %v", held, err)
	}
	if _, err := g.Do(ctx, phone, func(context.Context) error { return nil }); !errors.Is(err, guard.ErrBusy) {
		t.Fatalf("Do while the permit is held: %v; want ErrBusy", err)
	}
	held.Done()

	rm := e.collect(t)
	waits := map[string]uint64{}
	for _, p := range histogram(t, rm, otelguard.MetricSemaphoreWait) {
		a := attrs(p.Attributes)
		if a["funnelguard.prefix"] != "api:export:" {
			t.Errorf("permit wait attributes %v", a)
		}
		waits[a["funnelguard.outcome"]] += p.Count
		if a["funnelguard.outcome"] == "not_obtained" && p.Sum < 0.2 {
			t.Errorf("busy call waited %vs; want about the Timeout", p.Sum)
		}
	}
	if len(waits) != 2 || waits["ok"] != 1 || waits["not_obtained"] != 1 {
		t.Errorf("permit waits by outcome %v; want ok 1, not_obtained 1", waits)
	}
	got := map[string]int64{}
	for _, p := range counter(t, rm, otelguard.MetricDecisions) {
		a := attrs(p.Attributes)
		got[a["funnelguard.outcome"]+"/"+a["error.type"]] += p.Value
	}
	if len(got) != 2 || got["allowed/"] != 1 || got["error/busy"] != 1 {
		t.Errorf("decisions %v; want allowed 1, error/busy 1", got)
	}
}
