package funnel

// SetOnJoin makes f run whenever a call of l joins a batch led by another,
// so that a test can wait until the calls it started share a lock hold.
func SetOnJoin(l *Limiter, f func()) { l.batches.onJoin = f }

// SetOnLead makes f run with a call's units whenever a call of l opens a
// batch, which it leads.
func SetOnLead(l *Limiter, f func(n int64)) { l.batches.onLead = f }

// StateField returns the field of r in a key's state hash.
func StateField(r Rule) string {
	c, err := r.compile()
	if err != nil {
		panic(err)
	}
	return c.id
}
