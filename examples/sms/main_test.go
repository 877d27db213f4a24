package main

import (
	"testing"

	"github.com/funnelguard/funnelguard/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m, removeBinary) }
