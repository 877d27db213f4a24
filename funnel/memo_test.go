package funnel

import (
	"sync"
	"sync/atomic"
	"testing"
)

// Racing gets of one key all return the first value cached, and the memo
// stops growing at maxCompiled keys, building past them per call.
func TestMemoFirstWinsAndBounded(t *testing.T) {
	var c memo[int, *int]
	var builds atomic.Int64
	build := func(k int) func() (*int, error) {
		return func() (*int, error) {
			builds.Add(1)
			v := k
			return &v, nil
		}
	}
	const racers = 32
	got := make([]*int, racers)
	var wg sync.WaitGroup
	for i := range racers {
		wg.Go(func() {
			v, err := c.get(7, build(7))
			if err != nil {
				t.Error(err)
			}
			got[i] = v
		})
	}
	wg.Wait()
	for i, v := range got {
		if v != got[0] {
			t.Fatalf("racer %d got a value of its own (%p, first %p): the first cached must win", i, v, got[0])
		}
	}
	for k := range 2 * maxCompiled {
		if _, err := c.get(k, build(k)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(*c.m.Load()); n != maxCompiled {
		t.Fatalf("memo holds %d keys, want %d", n, maxCompiled)
	}
	before := builds.Load()
	a, _ := c.get(2*maxCompiled-1, build(2*maxCompiled-1))
	b, _ := c.get(2*maxCompiled-1, build(2*maxCompiled-1))
	if builds.Load() != before+2 || a == b {
		t.Fatalf("a key past maxCompiled was cached (%d builds for 2 gets)", builds.Load()-before)
	}
	if v, _ := c.get(7, build(7)); v != got[0] {
		t.Fatal("a cached key was rebuilt")
	}
}
