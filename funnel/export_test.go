package funnel

// SetBeforeCommit makes f run in every admission of l between the read and
// the commit, so a test can stall a commit past its lock's lease.
func SetBeforeCommit(l *Limiter, f func()) { l.beforeCommit = f }
