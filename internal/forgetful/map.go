package forgetful

// A Map holds at most its bound of keys; Put of a new key when it is full
// first forgets the older half (by when they were put first). It is not
// safe for concurrent use: its owner holds a lock.
type Map[K comparable, V any] struct {
	max   int
	items map[K]V
	order []K // keys in the order they were first put
}

// New returns a Map of at most max keys (at least 1).
func New[K comparable, V any](max int) *Map[K, V] {
	return &Map[K, V]{max: max, items: make(map[K]V)}
}

// Get returns key's value, and whether the Map holds it.
func (m *Map[K, V]) Get(key K) (V, bool) {
	v, ok := m.items[key]
	return v, ok
}

// Put sets key's value; a new key past the bound first forgets the older
// half of the keys.
func (m *Map[K, V]) Put(key K, v V) {
	if _, ok := m.items[key]; !ok {
		if len(m.items) >= m.max {
			m.forgetOlder()
		}
		m.order = append(m.order, key)
	}
	m.items[key] = v
}

// Len is how many keys the Map holds.
func (m *Map[K, V]) Len() int { return len(m.items) }

// forgetOlder forgets the older half of the keys (one at least).
func (m *Map[K, V]) forgetOlder() {
	half := max(len(m.order)/2, 1)
	for _, k := range m.order[:half] {
		delete(m.items, k)
	}
	m.order = append(m.order[:0:0], m.order[half:]...)
}
