package mutex

// QueueLen returns how many goroutines of l wait for name (a test seam).
func QueueLen(l *Locker, name string) int { return l.Waiters(name) }

// Marked reports whether a lock's stored value carries a waiter's mark (a
// test seam: the format is held.lua's).
func Marked(value string) bool {
	return len(value) > tokenLen && value[tokenLen] == 'w'
}
