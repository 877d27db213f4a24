package servercheck

import (
	"fmt"
	"slices"
	"strings"
	"sync"
)

// A collector gathers the findings of one Check, which closes it when it
// returns, before asking ended on a client that ignores deadlines: the
// askers' late findings are dropped (close returns a copy).
type collector struct {
	mu       sync.Mutex
	findings []Finding
	closed   bool
}

// start records that the server at addr is being asked and returns its
// index, or -1 when the collector is closed.
func (col *collector) start(addr string) int {
	col.mu.Lock()
	defer col.mu.Unlock()
	if col.closed {
		return -1
	}
	col.findings = append(col.findings, Finding{Addr: addr, MaxMemory: -1})
	return len(col.findings) - 1
}

// finish records the finding of index i.
func (col *collector) finish(i int, f Finding) {
	col.mu.Lock()
	defer col.mu.Unlock()
	col.findings[i] = f
}

// missing records err as the finding of a server at addr that was not asked
// at all, unless a finding names addr already.
func (col *collector) missing(addr string, err error) {
	col.mu.Lock()
	defer col.mu.Unlock()
	if slices.ContainsFunc(col.findings, func(f Finding) bool { return f.Addr == addr }) {
		return
	}
	col.findings = append(col.findings, Finding{Addr: addr, MaxMemory: -1, Err: err})
}

// close closes the collector and returns its findings ordered by address; a
// server still being asked (no Err and no Policy: ask judges every
// server to one or the other) gets ErrNoAnswer with cause, why Check
// stopped waiting (never nil then: askAll returns once every ask did).
func (col *collector) close(cause error) []Finding {
	col.mu.Lock()
	defer col.mu.Unlock()
	col.closed = true
	out := slices.Clone(col.findings)
	for i := range out {
		if out[i].Err == nil && out[i].Policy == "" {
			out[i].Err = fmt.Errorf("%w: %s: %w", ErrNoAnswer, out[i].Addr, cause)
		}
	}
	slices.SortStableFunc(out, func(a, b Finding) int { return strings.Compare(a.Addr, b.Addr) })
	return out
}
