package testmust

import (
	"testing"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/mutex"
)

// Locker is mutex.New, failing t on an error.
func Locker(t testing.TB, c mutex.Client, opts ...mutex.Option) *mutex.Locker {
	t.Helper()
	l, err := mutex.New(c, opts...)
	if err != nil {
		t.Fatalf("mutex.New: %v", err)
	}
	return l
}

// Limiter is funnel.New, failing t on an error.
func Limiter(t testing.TB, c mutex.Client, opts ...funnel.Option) *funnel.Limiter {
	t.Helper()
	lim, err := funnel.New(c, opts...)
	if err != nil {
		t.Fatalf("funnel.New: %v", err)
	}
	return lim
}

// Key is l.Key, failing t on an error.
func Key(t testing.TB, l *mutex.Locker, name, kind string) string {
	t.Helper()
	k, err := l.Key(name, kind)
	if err != nil {
		t.Fatalf("Key(%q, %q): %v", name, kind, err)
	}
	return k
}

// Semaphore is l.Semaphore, failing t on an error.
func Semaphore(t testing.TB, l *mutex.Locker, name string, size int64) *mutex.Semaphore {
	t.Helper()
	s, err := l.Semaphore(name, size)
	if err != nil {
		t.Fatalf("Semaphore(%q, %d): %v", name, size, err)
	}
	return s
}
