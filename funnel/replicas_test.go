package funnel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// With WithReplicaAck an admission returns once the replica has its charge;
// with the replica frozen, admissions fail with mutex.ErrNotReplicated while
// denials still answer (they write nothing, and wait for nothing).
func TestReplicaAckAdmissions(t *testing.T) {
	r := testutil.StartReplicated(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := r.Master.Client(t)
	rec := &testutil.CommandRecorder{}
	c.AddHook(rec)
	rc := r.Replicas[0].Client(t)
	lim := mustLimiter(t, c, funnel.WithReplicaAck(1, time.Second), funnel.WithPrefix("ra:")) // a bound a loaded machine keeps
	rule := funnel.Rule{Name: "r", Capacity: 3, Leak: 1, Per: time.Hour}
	if _, err := lim.Allow(ctx, "warm", rule); err != nil { // the scripts loaded
		t.Fatal(err)
	}
	for i := range 3 {
		rec.Reset()
		res, err := lim.Allow(ctx, "k", rule)
		waits, trips := 0, map[int]bool{}
		for _, cmd := range rec.Commands() {
			trips[cmd.Trip] = true
			if cmd.Name == "wait" {
				waits++
			}
		}
		if waits != 1 || len(trips) != 2 {
			t.Fatalf("admission #%d: %d WAITs in %d round trips, want 1 in 2 (the commit's covers the lock)", i, waits, len(trips))
		}
		if err != nil || !res.Allowed {
			t.Fatalf("Allow #%d: %+v, %v", i, res, err)
		}
		// The charge is on the replica when Allow returns: a fresh reader
		// of the replica's state sees this admission.
		got, err := mustLimiter(t, rc, funnel.WithPrefix("ra:")).Peek(ctx, "k", rule)
		if err != nil || got.Remaining != int64(2-i) {
			t.Fatalf("Peek on the replica after admission #%d = %+v, %v; want %d remaining", i, got, err, 2-i)
		}
	}
	thaw := testutil.Freeze(t, r.Replicas[0].Pid())
	defer thaw()
	res, err := lim.Allow(ctx, "k", rule)
	if err != nil || res.Allowed {
		t.Fatalf("Allow of a full key with a frozen replica = %+v, %v; want a denial", res, err)
	}
	res, err = lim.Allow(ctx, "other", rule)
	if !errors.Is(err, mutex.ErrNotReplicated) || res.Allowed {
		t.Fatalf("Allow with a frozen replica = %+v, %v; want ErrNotReplicated", res, err)
	}
}

// WithReplicaAck refuses what cannot work.
func TestReplicaAckOptions(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer c.Close()
	rule := funnel.Rule{Name: "r", Capacity: 3, Leak: 1, Per: time.Hour}
	for _, tc := range []struct {
		name string
		opts []funnel.Option
	}{
		{"no replica", []funnel.Option{funnel.WithReplicaAck(0, time.Second)}},
		{"no bound", []funnel.Option{funnel.WithReplicaAck(1, 0)}},
		{"a Locker without it", []funnel.Option{funnel.WithLocker(mustLocker(t, c)), funnel.WithReplicaAck(1, time.Second)}},
	} {
		if lim, err := funnel.New(c, tc.opts...); !errors.Is(err, funnel.ErrInvalidOption) || lim != nil {
			t.Errorf("%s: New = %v, %v; want nil, ErrInvalidOption", tc.name, lim, err)
		}
	}
	ok := mustLimiter(t, c, funnel.WithLocker(mustLocker(t, c, mutex.WithReplicaAck(1, time.Second))), funnel.WithReplicaAck(1, time.Second))
	if _, err := ok.Allow(context.Background(), "k", rule); errors.Is(err, funnel.ErrInvalidOption) {
		t.Errorf("the same acknowledgement on the Locker and the Limiter: %v", err)
	}
}
