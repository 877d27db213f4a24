package nilcheck_test

import (
	"bytes"
	"fmt"
	"io"

	"github.com/funnelguard/funnelguard/internal/nilcheck"
)

// A typed nil pointer in an interface is nil too: a constructor refuses it
// with an error instead of panicking on its first use.
func ExampleIsNil() {
	var b *bytes.Buffer
	var w io.Writer = b
	fmt.Println(w == nil, nilcheck.IsNil(w))
	fmt.Println(nilcheck.IsNil(io.Discard))
	// Output:
	// false true
	// false
}
