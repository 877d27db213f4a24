package phonekey_test

import (
	"testing"

	"github.com/funnelguard/funnelguard/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }
