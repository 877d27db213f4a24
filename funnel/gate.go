package funnel

import (
	"context"
	_ "embed"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/funnelguard/funnelguard/internal/forgetful"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/redis/go-redis/v9"
)

// The one-script admission (DESIGN.md, "Cost"): while the lock is free,
// admit.lua admits a key with no state, returning.lua one whose state is
// the state cache's; otherwise they only read, as read.lua does.

var (
	//go:embed admit.lua
	admitSrc string
	//go:embed returning.lua
	returningSrc string

	admitScript     = redis.NewScript(admitWithRead)
	returningScript = redis.NewScript(readStateFunc + returningSrc)
	admitGate       = mutex.NewGate(admitWithRead)
	admitWithRead   = spliceRead(admitSrc)
)

// readMarker is the line of admit.lua that read.lua's functions replace:
// they are defined on the path that reads, so that a first call makes no
// closure.
const readMarker = "-- read.lua "

func spliceRead(src string) string {
	head, tail, ok := strings.Cut(src, readMarker)
	if !ok || strings.Contains(tail, readMarker) {
		panic("funnel: admit.lua needs one line " + readMarker)
	}
	return head + readStateFunc + "-- " + tail
}

// oneScript runs the one-script admission alone, for a call of funnels
// with the state cache: its reply as a gate's declined result, or an
// error; decided false when the call goes on through the lock.
func (l *leader) oneScript(ctx context.Context) (res any, decided bool, err error) {
	for try := 0; try < 2; try++ {
		call, script := l.admitGate(ctx)
		if script == nil {
			return nil, false, nil // no clock sample to bound its write by
		}
		reply, err := l.lim.locker.Eval(ctx, script, call.Keys, call.Args...)
		if err != nil {
			return nil, true, corrupt(fmt.Errorf("funnel: admit: %w", err))
		}
		p, res, err := readReply(reply)
		if err != nil { // decided in the script (proceed 0: ErrDeclined)
			return res, true, err
		}
		l.recv = time.Now()
		l.lim.clock.sampled(res[0].(int64), l.recv)
		if p == 2 { // the lock is held
			return nil, false, nil
		}
		l.saw(res) // another process's state: returning.lua on it
	}
	return nil, false, nil
}

// readReply splits a read's reply, {proceed, now, ...}: proceed, and the
// rest as a gate's result, with ErrDeclined when proceed is 0.
func readReply(reply any) (int64, []any, error) {
	arr, _ := reply.([]any) // another type has no length
	if len(arr) < 2 {
		return 0, nil, fmt.Errorf("%w: a read returned %T", ErrCorruptState, reply)
	}
	p, _ := arr[0].(int64)
	if _, ok := arr[1].(int64); !ok {
		return 0, nil, fmt.Errorf("%w: a read's time is %T", ErrCorruptState, arr[1])
	}
	if p == 0 {
		return 0, arr[1:], mutex.ErrDeclined
	}
	return p, arr[1:], nil
}

// settleGate answers the leader's call on the gate's verdict at server time
// now, "admitted" or "late" (past the call's deadline, nothing written), and
// returns the calls still to decide (see settle).
func (l *leader) settleGate(ws sealed, now int64, verdict, how string) sealed {
	s := l.lim.clock.sampled(now, l.recv)
	switch {
	case verdict == "admitted":
		ws[0].res = l.admitAlone(now, how, len(ws) > 1)
		return l.carryOn(ws[1:])
	case !outOfTime(ws[0].deadline):
		// Late with time left: the sample was off (the server's clock
		// stepped forward); this reply's bounds the next attempt.
		l.lim.clock.keep(s)
		l.late = true
		return ws
	}
	ws.failLeader(errLate)
	return nil
}

// carryOn makes the leader, whose call its gate admitted alone, lead the
// calls that joined meanwhile, rest, on, through read.lua: they share one
// lock hold (or, crowded, one commit) rather than each running again.
func (l *leader) carryOn(rest sealed) sealed {
	if len(rest) > 0 {
		l.lock, l.seen, l.exp = "", nil, nil
		l.optimistic = l.cache
		l.stamp()
	}
	return rest
}

// admitGate returns an admission attempt's call and script: returning.lua's
// when the call can be decided on the state seen, else admit.lua's; no
// script when admit.lua may only read (throughLock).
func (l *leader) admitGate(ctx context.Context) (mutex.Call, *redis.Script) {
	clock := &l.lim.clock
	d, ok := ctx.Deadline()
	s, fresh := clock.latest(l.sent) // one sample for both
	deadline, script := noDeadline, admitScript
	switch {
	case ok && !fresh:
		deadline, script = throughLock, nil
	case ok:
		deadline = max(s.until(clock.local(d, false)), 1)
	}
	l.nonce, l.exp = newNonce(), nil
	if fresh && l.seen != nil {
		// The server's clock reads at least the time of the latest reply
		// when the gate runs (a clock that stands still, a test's, too).
		if gate, exp, ok := l.c.returning(l.n, l.lock, l.seen, s.offset+s.at, deadline, l.nonce); ok {
			l.exp = exp
			return gate, returningScript
		}
	}
	return l.c.admit(l.n, l.lock, deadline, l.nonce), script
}

// admitAlone returns the leader's admission by its gate at server time now,
// and keeps what the gate wrote in the state cache.
func (l *leader) admitAlone(now int64, how string, others bool) Result {
	rules := l.c.set.rules
	var levels []level
	if l.cache { // returning.lua (l.exp) runs only with it
		var values []string
		if l.exp != nil {
			levels, values = l.c.returned(l.seen, l.exp, how, now, l.nonce)
		} else {
			values = make([]string, len(rules))
			for i := range rules {
				fresh, _ := l.c.fresh(i, l.n)
				values[i] = stamped(fresh, now, l.nonce)
			}
		}
		l.lim.states.store(l.c.key, l.c.set, values, &others)
	}
	d := decide(rules, levels, now, l.n)
	return d.result(rules)
}

// gateArgs holds a gate's arguments and keys in one allocation: admit.lua's
// while the rules fit (setMax), returning.lua's, with its slices, for one
// rule. Numbers and strings go by pointer (into it, exp or the values
// seen): boxing each would allocate.
type gateArgs struct {
	args  [2*setMax + 4]any
	keys  [2]string
	nums  [7]int64
	exp   [1]expectation
	nonce string
}

// admit returns admit.lua's gate for n units, checking that lock is free
// and writing only before the server time deadline.
func (c call) admit(n int64, lock string, deadline int64, nonce string) mutex.Call {
	m := &gateArgs{keys: [2]string{c.key, lock}, nums: [7]int64{deadline}, nonce: nonce}
	var args []any
	if n == 1 { // into m.args while the rules fit (4: setMax)
		args = append(m.args[:0], c.set.admit1...)
	} else {
		args = admitArgs(c.set.rules, c.set.ids, n)
	}
	args = append(args, &m.nums[0], &m.nonce)
	return mutex.Call{Fragment: admitGate, Keys: m.keys[:], Args: args}
}

func newNonce() string {
	return strconv.FormatUint(rand.Uint64()>>23, 36)
}

// admitArgs returns admit.lua's arguments for n units but the deadline and
// the nonce: the fields, each rule's value after n units on an empty state
// without its time, the key's TTL in ms, and the rules' largest grid.
func admitArgs(rules []rule, ids []any, n int64) []any {
	args := append(make([]any, 0, 2*len(rules)+4), ids...)
	var ttl, grid int64 = 0, 1
	for _, r := range rules {
		v, t := r.fresh(n)
		args = append(args, v)
		ttl, grid = max(ttl, t), max(grid, r.grid)
	}
	return append(args, ttl, grid)
}

// fresh returns rule r's value after n units on an empty state, without
// its time, and the TTL in ms that it needs.
func (r rule) fresh(n int64) (string, int64) {
	lv := decide([]rule{r}, nil, 0, n).level(0)
	return string(r.appendValue(nil, lv)), min(ceilDiv(r.waitIn(lv, r.full/r.per), 1000), maxFreshTTL)
}

// fresh is rule i's fresh(n), made once per set (of funnels) for n = 1.
func (c call) fresh(i int, n int64) (string, int64) {
	if n == 1 {
		return c.set.fresh1[i], c.set.freshTTL1[i]
	}
	return c.set.rules[i].fresh(n)
}

// maxLuaInt is the largest integer a Lua number holds exactly.
const maxLuaInt = 1 << 53

// An expectation is what returning.lua gets for one rule (that file says
// what each field is); a rule with nothing seen has all zero.
type expectation struct {
	fit, anchor, empty, expiry int64
	kept                       string
	fresh                      string
}

// expect returns funnel r's expectation for n more units on the value seen
// ("" for none), the server's clock reading at least est when the gate
// runs; false when seen does not parse or a time does not fit a Lua number
// (only a set of funnels keeps values to return to: ruleSet.funnels). A funnel's level is linear until it empties, so the
// value anchored at max(fit, est) is the one the lock path would write.
func (r rule) expect(seen string, n, est int64) (expectation, bool) {
	if seen == "" {
		return expectation{}, true
	}
	lv, ok := parseLevel(seen)
	if !ok || lv.fill > r.full {
		return expectation{}, false
	}
	e := expectation{empty: satAdd(lv.at, ceilDiv(lv.fill, r.leak))}
	a := lv.at
	if w := r.wait(lv.fill, n); w > 0 {
		e.fit = satAdd(lv.at, w)
		a = e.fit
	}
	a = max(a, est)
	e.anchor = a
	fill := r.drain(lv, a) + n*r.per
	e.kept = r.encode(level{fill: fill, at: a})
	e.expiry = r.expiryOf(satAdd(a, ceilDiv(fill, r.leak)))
	return e, e.empty < maxLuaInt && e.expiry < maxLuaInt/1000 && e.expiry-est/1000 < maxFreshTTL
}

// returning returns returning.lua's gate for n units of c on the values
// seen, and the expectations sent; false when a rule cannot be decided there.
func (c call) returning(n int64, lock string, seen []string, est, deadline int64, nonce string) (mutex.Call, []expectation, bool) {
	k := len(c.set.rules)
	m := &gateArgs{keys: [2]string{c.key, lock}, nonce: nonce}
	exp, nums, args := m.exp[:], m.nums[:], m.args[:0]
	if k > 1 {
		exp, nums, args = make([]expectation, k), make([]int64, 6*k+1), make([]any, 0, 10*k+2)
	}
	args = append(args, c.set.ids...)
	for i, r := range c.set.rules {
		e, ok := r.expect(seen[i], n, est)
		if !ok {
			return mutex.Call{}, nil, false
		}
		var ttl int64
		e.fresh, ttl = c.fresh(i, n)
		exp[i] = e
		x := nums[6*i : 6*i+6]
		x[0], x[1], x[2], x[3], x[4], x[5] = e.fit, e.anchor, e.empty, e.expiry, ttl, r.grid
		args = append(args, &seen[i], &x[0], &x[1], &x[2], &exp[i].kept, &x[3], &exp[i].fresh, &x[4], &x[5])
	}
	nums[6*k] = deadline
	args = append(args, &nums[6*k], &m.nonce)
	return mutex.Call{Keys: m.keys[:], Args: args}, exp, true
}

// returned returns the levels the returning gate admitted the call on and
// the values it wrote at now, given how it wrote each rule ('k': kept, 'f':
// fresh). how is "" when a retry found the call admitted: the values are
// not known (nil), and the levels are those seen.
func (c call) returned(seen []string, exp []expectation, how string, now int64, nonce string) ([]level, []string) {
	levels := make([]level, len(c.set.rules))
	var values []string
	if len(how) == len(c.set.rules) {
		values = make([]string, len(c.set.rules))
	}
	for i := range c.set.rules {
		switch {
		case values == nil:
			levels[i], _ = parseLevel(seen[i]) // "" fails: an empty level
		case how[i] == 'k':
			levels[i], _ = parseLevel(seen[i])
			values[i] = exp[i].kept + ":" + nonce
		default:
			values[i] = stamped(exp[i].fresh, now, nonce)
		}
	}
	return levels, values
}

// stamped returns a value a gate wrote: prefix, now in base 36, the nonce.
func stamped(prefix string, now int64, nonce string) string {
	b := make([]byte, 0, len(prefix)+14+len(nonce))
	b = append(b, prefix...)
	b = strconv.AppendInt(b, now, 36)
	b = append(b, ':')
	return string(append(b, nonce...))
}

// DefaultStateCache is how many keys' state a Limiter remembers by default
// (WithStateCache).
const DefaultStateCache = 1 << 14

// MaxStateCache is the most keys WithStateCache accepts.
const MaxStateCache = 1 << 24

// A stateCache remembers, per state key, its rules' values as this Limiter
// last read or wrote them; returning.lua checks them, so an entry needs no
// invalidation. It holds at most max keys (forgetful.Map). The Limiter's
// is nil when off: a leader asks it only then (leader.cache).
type stateCache struct {
	mu sync.Mutex
	m  *forgetful.Map[string, seenState]
}

// seenState is one key's entry: the rule set it was seen with, the values
// ("" for none), and whether the key is crowded (crowded.go).
type seenState struct {
	set     *ruleSet
	values  []string
	crowded bool
}

func newStateCache(max int) *stateCache {
	return &stateCache{m: forgetful.New[string, seenState](max)}
}

// lookup returns the values seen for key's rules set (nil if none), and
// whether the key is crowded.
func (c *stateCache) lookup(key string, set *ruleSet) ([]string, bool) {
	c.mu.Lock()
	e, _ := c.m.Get(key)
	c.mu.Unlock()
	if e.set != set {
		return nil, false
	}
	return e.values, e.crowded
}

// store remembers values as key's state for set, crowded as *crowd says
// (an admission had others waiting; nil: as it was); nil values (not
// known) are none, and not crowded. It never writes into a slice it keeps:
// lookup's callers send its strings by pointer.
func (c *stateCache) store(key string, set *ruleSet, values []string, crowd *bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, _ := c.m.Get(key)
	if crowd != nil {
		e.crowded = *crowd
	}
	c.m.Put(key, seenState{set: set, values: values, crowded: e.crowded && values != nil})
}

// saw keeps the values of a read reply, {now, value...}, as the state seen
// (with the state cache: l.cache).
func (l *leader) saw(res any) {
	arr, _ := res.([]any)
	if len(arr) != len(l.c.set.rules)+1 {
		return
	}
	values := make([]string, len(l.c.set.rules))
	for i := range values {
		values[i], _ = arr[i+1].(string)
	}
	l.seen = values
	l.lim.states.store(l.c.key, l.c.set, values, nil)
}
