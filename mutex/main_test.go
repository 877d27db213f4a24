package mutex_test

import (
	"testing"

	"github.com/funnelguard/funnelguard/internal/testmust"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// newLocker returns a Locker on a fresh client of b, under b's key prefix.
func newLocker(t testing.TB, b *testutil.Backend, opts ...mutex.Option) *mutex.Locker {
	t.Helper()
	return mustNew(t, b.Client(t), append([]mutex.Option{mutex.WithPrefix(b.Prefix)}, opts...)...)
}

// mustNew is mutex.New for options that must be good: it fails t otherwise.
func mustNew(t testing.TB, c mutex.Client, opts ...mutex.Option) *mutex.Locker {
	t.Helper()
	return testmust.Locker(t, c, opts...)
}

// mustKey is l.Key for a kind that must be good: it fails t otherwise.
func mustKey(t testing.TB, l *mutex.Locker, name, kind string) string {
	t.Helper()
	return testmust.Key(t, l, name, kind)
}
