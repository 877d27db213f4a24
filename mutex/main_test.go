package mutex_test

import (
	"testing"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// newLocker returns a Locker on a fresh client of b, under b's key prefix.
func newLocker(t testing.TB, b *testutil.Backend, opts ...mutex.Option) *mutex.Locker {
	return mutex.New(b.Client(t), append([]mutex.Option{mutex.WithPrefix(b.Prefix)}, opts...)...)
}
