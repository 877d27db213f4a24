package mutex

// QueueLen returns how many goroutines of l wait for name (a test seam).
func QueueLen(l *Locker, name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if q := l.queues[name]; q != nil {
		return len(q.waiters)
	}
	return 0
}
