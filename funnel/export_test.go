package funnel

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// IsWindow reports whether r is a Window rule.
func IsWindow(r Rule) bool { return r.kind == kindWindow }

// Calendar returns the zone of r and whether it counts months, if r is a
// PerDay or PerMonth rule (ok).
func Calendar(r Rule) (loc *time.Location, month, ok bool) {
	return r.loc, r.kind == kindMonth, r.kind == kindDay || r.kind == kindMonth
}

// DenyCacheLen returns the number of entries in l's deny cache.
func DenyCacheLen(l *Limiter) int { return l.denials.len() }

// DenyCache is the deny cache, for tests that drive it directly.
type DenyCache = denyCache

// RuleSet is a call's compiled rules; a DenyCache tells sets apart by
// pointer only.
type RuleSet = ruleSet

// NewDenyCache returns a deny cache of max keys.
func NewDenyCache(max int) *DenyCache { return newDenyCache(max) }

func (c *denyCache) Lookup(key string, set *RuleSet, n int64) (Result, bool) {
	return c.lookup(key, set, n)
}
func (c *denyCache) Epoch() uint64 { return c.forgets.Load() }
func (c *denyCache) Store(key string, set *RuleSet, n int64, sent time.Time, epoch uint64, r Result) {
	c.store(key, set, n, sent, epoch, r)
}
func (c *denyCache) Forget(key string) { c.forget(key) }
func (c *denyCache) Len() int          { return c.len() }

// len returns the number of entries, expired ones included.
func (c *denyCache) len() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}

// Check verifies the cache's structure: the list from oldest to newest
// holds at most max entries, each knowing its element, each key once, and
// the lock-free map holds exactly the list's denials.
func (c *denyCache) Check() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.order.Len() > c.max {
		return fmt.Errorf("%d entries, max %d", c.order.Len(), c.max)
	}
	seen := map[string]bool{}
	for el := c.order.Front(); el != nil; el = el.Next() {
		if len(seen) >= c.order.Len() {
			return errors.New("the list loops")
		}
		e := el.Value.(*denial)
		v, ok := c.entries.Load(e.key)
		switch {
		case e.el != el:
			return fmt.Errorf("entry %q does not know its element", e.key)
		case seen[e.key]:
			return fmt.Errorf("key %q is in the list twice", e.key)
		case !ok || v != e:
			return fmt.Errorf("entry %q is not the lock-free map's", e.key)
		}
		seen[e.key] = true
	}
	n := 0
	c.entries.Range(func(any, any) bool { n++; return true })
	if n != len(seen) {
		return fmt.Errorf("the lock-free map holds %d keys; the list %d", n, len(seen))
	}
	return nil
}

// WindowState returns the field and the stored value of window r holding
// units taken at the times log (ascending, µs) at server time at.
func WindowState(r Rule, log []int64, at int64) (field, value string) {
	c, err := r.compile()
	if err != nil {
		panic(err)
	}
	return c.id, c.encode(level{fill: int64(len(log)), at: at, log: &log})
}

// LoadScripts loads the scripts of a crowded key's batches (read.lua run
// alone, commit.lua), so that a test counting commands counts no NOSCRIPT.
func LoadScripts(ctx context.Context, c redis.Scripter) error {
	for _, s := range []*redis.Script{readPeek, commitScript} {
		if err := s.Load(ctx, c).Err(); err != nil {
			return err
		}
	}
	return nil
}

// SetCrowded marks key as crowded in l's state cache, for the rules: its
// next batches commit without the lock (crowded.go).
func SetCrowded(l *Limiter, key string, rules ...Rule) error {
	set, err := l.ruleSet(rules)
	if err != nil {
		return err
	}
	crowded := true
	k, _ := l.keys(key)
	l.states.store(k, set, make([]string, len(rules)), &crowded)
	return nil
}

// CommitSHA is commit.lua's script hash, for tests that count its runs.
var CommitSHA = commitScript.Hash()

// WriteBackSHA is the hash of the script that a batch's commit under the
// lock runs (write.lua inside the lock's release), and ReadGateSHA that of
// the lock attempt with read.lua's gate (a Limiter of uniform cost): for
// tests that hook a client's commands to act at those moments.
var (
	WriteBackSHA = fragmentSHA(writeBack, "release")
	ReadGateSHA  = fragmentSHA(readGate, "acquire")
)

// fragmentSHA returns the hash of f's script of the given field. mutex
// exports no hash of a Fragment's scripts, which wrap the fragment in its
// own: it is read from the field, a *redis.Script. A rename there panics
// here, when the tests start.
func fragmentSHA(f *mutex.Fragment, field string) string {
	v := reflect.ValueOf(f).Elem().FieldByName(field)
	if !v.IsValid() || v.Type() != reflect.TypeFor[*redis.Script]() {
		panic(fmt.Sprintf("mutex.Fragment has no *redis.Script %s", field))
	}
	return (*redis.Script)(v.UnsafePointer()).Hash()
}

// Grid returns the step to which r's writes round a key's expiry up.
func Grid(r Rule) time.Duration {
	c, err := r.compile()
	if err != nil {
		panic(err)
	}
	return time.Duration(c.grid) * time.Millisecond
}
