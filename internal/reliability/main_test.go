package reliability

import (
	"testing"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// mustLocker is mutex.New for options that must be good: it fails t
// otherwise.
func mustLocker(t testing.TB, c mutex.Client, opts ...mutex.Option) *mutex.Locker {
	t.Helper()
	l, err := mutex.New(c, opts...)
	if err != nil {
		t.Fatalf("mutex.New: %v", err)
	}
	return l
}

// mustLimiter is funnel.New for options that must be good: it fails t
// otherwise.
func mustLimiter(t testing.TB, c mutex.Client, opts ...funnel.Option) *funnel.Limiter {
	t.Helper()
	lim, err := funnel.New(c, opts...)
	if err != nil {
		t.Fatalf("funnel.New: %v", err)
	}
	return lim
}

// mustKey is l.Key for a kind that must be good: it fails t otherwise.
func mustKey(t testing.TB, l *mutex.Locker, name, kind string) string {
	t.Helper()
	k, err := l.Key(name, kind)
	if err != nil {
		t.Fatalf("Key(%q, %q): %v", name, kind, err)
	}
	return k
}
