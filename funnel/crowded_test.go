package funnel

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A key's turn is held by one batch at a time; a waiter whose ctx ends
// gets its error and leaves no entry; the map forgets a key nobody wants.
func TestTurns(t *testing.T) {
	var ts turns
	k := batchKey{key: "k"}
	done, err := ts.take(context.Background(), k)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := ts.take(short, k); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second take while the turn is held = %v; want the ctx's error", err)
	}
	got := make(chan func(), 1)
	go func() {
		d, err := ts.take(context.Background(), k)
		if err != nil {
			t.Error(err)
		}
		got <- d
	}()
	select {
	case <-got:
		t.Fatal("a take got the turn while it was held")
	case <-time.After(20 * time.Millisecond):
	}
	done()
	(<-got)()
	if n := len(ts.m); n != 0 {
		t.Fatalf("%d entries left; want none", n)
	}
}
