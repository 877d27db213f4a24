package funnel_test

import (
	"testing"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// newLimiter returns a Limiter on a fresh client of b, under b's prefix.
func newLimiter(t testing.TB, b *testutil.Backend, opts ...funnel.Option) *funnel.Limiter {
	return funnel.New(b.Client(t), append([]funnel.Option{funnel.WithPrefix(b.Prefix)}, opts...)...)
}
