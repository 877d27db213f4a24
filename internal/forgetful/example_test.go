package forgetful_test

import (
	"fmt"

	"github.com/funnelguard/funnelguard/internal/forgetful"
)

// A Map of at most 4 keys forgets the older half when a fifth comes.
func ExampleMap() {
	m := forgetful.New[string, int](4)
	for i, k := range []string{"a", "b", "c", "d", "e"} {
		m.Put(k, i)
	}
	_, a := m.Get("a")
	e, ok := m.Get("e")
	fmt.Println(m.Len(), a, e, ok)
	// Output: 3 false 4 true
}
