package keyspace_test

import (
	"fmt"

	"github.com/funnelguard/funnelguard/internal/keyspace"
)

// Every key of one name shares its hash tag, whatever braces the name
// holds; braces and '~' are escaped, so two names never share a tag.
func ExampleKey() {
	fmt.Println(keyspace.Key("fg:", "+15551234567", "lock"))
	fmt.Println(keyspace.Key("fg:", "a}{b", "state"))
	fmt.Println(keyspace.Key("fg:", "", "state"))
	// Output:
	// fg:{+15551234567}:lock
	// fg:{a~2~1b}:state
	// fg:{~}:state
}
