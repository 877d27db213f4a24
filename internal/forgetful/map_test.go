package forgetful_test

import (
	"testing"

	"github.com/funnelguard/funnelguard/internal/forgetful"
)

// A Map never holds more than its bound; past it, the older half goes and
// the newer half and the new key stay; a key put again keeps its place.
func TestMapBounded(t *testing.T) {
	m := forgetful.New[int, string](4)
	for k := range 4 {
		m.Put(k, "v")
	}
	m.Put(0, "again") // not new: nothing forgotten, 0 stays the oldest
	if m.Len() != 4 {
		t.Fatalf("Len = %d after 4 keys; want 4", m.Len())
	}
	m.Put(4, "v")
	for k, want := range map[int]bool{0: false, 1: false, 2: true, 3: true, 4: true} {
		if _, ok := m.Get(k); ok != want {
			t.Errorf("key %d held: %v; want %v", k, ok, want)
		}
	}
	for k := range 1000 {
		m.Put(100+k, "v")
		if m.Len() > 4 {
			t.Fatalf("Len = %d; want at most 4", m.Len())
		}
	}
	one := forgetful.New[string, int](1)
	one.Put("a", 1)
	one.Put("b", 2)
	if _, ok := one.Get("a"); ok || one.Len() != 1 {
		t.Errorf("a Map of 1 key holds a after b (Len %d)", one.Len())
	}
}
