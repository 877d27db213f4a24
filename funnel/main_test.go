package funnel_test

import (
	"testing"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testmust"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// newLimiter returns a Limiter on a fresh client of b, under b's prefix.
func newLimiter(t testing.TB, b *testutil.Backend, opts ...funnel.Option) *funnel.Limiter {
	t.Helper()
	return mustLimiter(t, b.Client(t), append([]funnel.Option{funnel.WithPrefix(b.Prefix)}, opts...)...)
}

// mustLimiter is funnel.New for options that must be good: it fails t
// otherwise.
func mustLimiter(t testing.TB, c mutex.Client, opts ...funnel.Option) *funnel.Limiter {
	t.Helper()
	return testmust.Limiter(t, c, opts...)
}

// mustLocker is mutex.New for options that must be good: it fails t
// otherwise.
func mustLocker(t testing.TB, c mutex.Client, opts ...mutex.Option) *mutex.Locker {
	t.Helper()
	return testmust.Locker(t, c, opts...)
}

// mustKey is l.Key for a kind that must be good: it fails t otherwise.
func mustKey(t testing.TB, l *mutex.Locker, name, kind string) string {
	t.Helper()
	return testmust.Key(t, l, name, kind)
}
