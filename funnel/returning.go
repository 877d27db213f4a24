package funnel

import (
	"strconv"

	"github.com/funnelguard/funnelguard/mutex"
)

// A returning key, one whose state this Limiter saw (statecache.go), is
// admitted in one round trip by returning.lua when its lock is free and its
// funnels hold what was seen: the caller decides on the values seen in
// advance, as server times to compare with TIME and the values to write,
// so Redis does no arithmetic (see that file). The decision is the one the
// two round trips would make; the value written for a funnel that has not
// emptied is the same level anchored at another time (see expect).

// maxLuaInt is the largest integer a Lua number (a double) holds exactly:
// times past it are not sent to returning.lua, the call takes the lock.
const maxLuaInt = 1 << 53

// An expectation is what returning.lua gets for one rule: from fit (server
// µs) the call's units fit; from empty the funnel holds nothing (and starts
// over: admit.lua's value); before empty the new value is kept, anchored
// at anchor (the gate reads instead before it), with the key's expiry (Unix
// ms). A rule with nothing seen has all zero: it starts over at any time.
type expectation struct {
	fit, anchor, empty, expiry int64
	kept                       string
	fresh                      string // the value from empty on, without its time
}

// expect returns rule r's expectation for n more units on the value seen
// ("" for none), when the server's clock reads at least est as the gate
// runs; false when r is no funnel, seen does not parse, or a time does not
// fit a Lua number.
//
// The kept value is the level the two round trips would write at the gate's
// time now, fill(now) + n units at now, anchored at a = max(the earliest
// time the units fit, est) instead: a funnel's level is linear until it
// empties, so fill(a) + n units at a is the same level at now and after
// (the gate writes it only for a <= now < empty). Anchored near now (at
// the server time of the Limiter's latest reply) rather than at the fit
// time, a server clock that steps back afterwards credits little leak
// twice; a server clock behind est (stepped back) makes the gate read
// instead.
func (r rule) expect(seen string, n, est int64) (expectation, bool) {
	if r.window > 0 || r.cal != nil || r.shared {
		return expectation{}, false
	}
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
	e.kept = r.encode(fill, a)
	e.expiry = ceilDiv(satAdd(a, ceilDiv(fill, r.leak)), 1000)
	return e, e.empty < maxLuaInt && e.expiry < maxLuaInt/1000
}

// fresh returns rule r's value after n units on an empty funnel, without
// its time (admit.lua and returning.lua append it), and the TTL in ms that
// it needs.
func (r rule) fresh(n int64) (string, int64) {
	if r.window > 0 {
		// n units taken at the time appended, offset 0.
		return string(r.appendWindow(nil, withUnits(nil, 0, n), 0)), ceilDiv(r.window, 1000)
	}
	fill := n * r.per
	b := strconv.AppendInt(nil, r.gate(r.wait(fill, 1)), 36)
	b = append(b, ':')
	b = strconv.AppendInt(b, fill, 36)
	return string(append(b, ':')), min(ceilDiv(ceilDiv(fill, r.leak), 1000), maxTTL)
}

// returning returns Allow's gate for n units of c on the values seen
// (returning.lua), and the expectations it was sent; false when a rule
// cannot be decided in the gate (then the call takes admit.lua's).
func (c call) returning(n int64, lock string, seen []string, est, deadline int64, nonce string) (mutex.Call, []expectation, bool) {
	k := len(c.rules)
	var exp []expectation
	var nums []int64
	var args []any
	var keys []string
	if k == 1 {
		// One allocation for the call's slices.
		m := new(returningArgs)
		exp, nums, args, keys = m.exp[:k], m.nums[:5*k+1], m.args[:0], m.keys[:]
	} else {
		exp, nums, args, keys = make([]expectation, k), make([]int64, 5*k+1), make([]any, 0, 9*k+2), make([]string, 2)
	}
	// The numbers are passed as pointers into nums (go-redis writes *int64
	// as the number), the strings as pointers into exp and seen: boxing
	// each would allocate.
	args = append(args, c.ids...)
	for i, r := range c.rules {
		e, ok := r.expect(seen[i], n, est)
		if !ok {
			return mutex.Call{}, nil, false
		}
		var ttl int64
		e.fresh, ttl = c.fresh(i, n)
		exp[i] = e
		x := nums[5*i : 5*i+5]
		x[0], x[1], x[2], x[3], x[4] = e.fit, e.anchor, e.empty, e.expiry, ttl
		// Strings too by pointer (go-redis writes *string as the string),
		// into exp and seen, which outlive the call's sends.
		args = append(args, &seen[i], &x[0], &x[1], &x[2], &exp[i].kept, &x[3], &exp[i].fresh, &x[4])
	}
	nums[5*k] = deadline
	args = append(args, &nums[5*k], nonce)
	keys[0], keys[1] = c.key, lock
	return mutex.Call{Fragment: returningGate, Keys: keys, Args: args}, exp, true
}

// returningArgs holds the slices of returning for a call of one rule, the
// most common.
type returningArgs struct {
	exp  [1]expectation
	nums [6]int64
	args [11]any
	keys [2]string
}

// fresh returns c's rule i's value after n units on an empty funnel and its
// TTL (see rule.fresh), made once per set for n = 1.
func (c call) fresh(i int, n int64) (string, int64) {
	if n == 1 && c.set.fresh1 != nil {
		return c.set.fresh1[i], c.set.freshTTL1[i]
	}
	return c.rules[i].fresh(n)
}

// returned returns the levels on which the returning gate admitted the
// call, given how it wrote each rule ('k': the kept value, 'f': started
// over), and the values it wrote at server time now; how is "" when a retry
// of the call found it admitted: the values written are then not known
// (nil), and the levels are those seen.
func (c call) returned(seen []string, exp []expectation, how string, now int64, nonce string) ([]level, []string) {
	levels := make([]level, len(c.rules))
	var values []string
	if len(how) == len(c.rules) {
		values = make([]string, len(c.rules))
	}
	for i := range c.rules {
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

// stamped returns a value that a gate wrote: prefix, the server time now in
// base 36, and the nonce of the call.
func stamped(prefix string, now int64, nonce string) string {
	b := make([]byte, 0, len(prefix)+14+len(nonce))
	b = append(b, prefix...)
	b = strconv.AppendInt(b, now, 36)
	b = append(b, ':')
	return string(append(b, nonce...))
}
