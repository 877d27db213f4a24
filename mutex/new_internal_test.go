package mutex

import "testing"

// mustNew is New for options that must be good: it fails tb otherwise.
func mustNew(tb testing.TB, c Client, opts ...Option) *Locker {
	tb.Helper()
	l, err := New(c, opts...)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return l
}
