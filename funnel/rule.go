package funnel

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"time"
)

// Limits of a Rule, so that every computation stays exact in int64.
const (
	// MaxRuleName is the longest rule name accepted, in bytes.
	MaxRuleName = 128
	// maxScaled bounds Capacity * Per (in µs) and Leak: sums of two such
	// values cannot overflow.
	maxScaled = 1 << 61
)

// A Rule is a funnel: it holds at most Capacity units and drains Leak units
// every Per. A call of n units is admitted when they fit, so a rule admits a
// burst of Capacity, then one unit every Per/Leak.
//
// In a window of length W a rule admits up to about Capacity + W*Leak/Per
// units, not W*Leak/Per: a "5 per hour" rule of Capacity 5 lets 9 through
// in some hour (5 at once, then one every 12 minutes), 10 in an hour and a
// microsecond. Quota gives the exact bound; use AtMost or Window for a hard
// bound per window.
//
// A rule makes the same decisions as GCRA, and as
// redis_rate.Limit{Burst: Capacity, Rate: Leak, Period: Per}.
//
// Window, PerDay and PerMonth return rules that count units instead: a
// sliding window and calendar budgets (see "Choosing a rule" in the package
// documentation). Their kind is not a field: build them with those
// functions.
type Rule struct {
	// Name identifies the rule in a Result and in the stored state.
	Name string
	// Capacity is the most units the funnel holds: the largest burst.
	Capacity int64
	// Leak units drain out of the funnel every Per.
	Leak int64
	// Per is the leak period, a whole number of microseconds.
	Per time.Duration

	// kind is what the rule counts: a funnel (the zero value), a sliding
	// window (see Window: Capacity units in any window of length Per), or
	// a calendar day or month (see PerDay: Capacity units in each, in loc).
	kind ruleKind
	loc  *time.Location
	// share names the state the rule keeps, if shared (Sharing); else
	// it keeps it under its name and figures.
	share  string
	shared bool
}

// Sharing returns r keeping its state under the name state instead of
// under its own name and figures: rules of one kind (a funnel, a window, a
// calendar day or month) and one Per (and zone) that share a state name
// keep one state in a key, whatever their Capacity and Leak. A key decided
// by one of them and then by another (a tenant moved to a smaller plan,
// see guard.Policy.Plans) is decided by the second on what the first
// took: moved from Window(1000, time.Minute) after 500 calls in the minute
// to Window(10, time.Minute), it is denied until the minute has passed.
// r's Name is unchanged: it names the rule in a Result. state is 1 to
// MaxRuleName bytes; two rules of one call cannot share one state.
func (r Rule) Sharing(state string) Rule {
	r.share, r.shared = state, true
	return r
}

// badShare reports a Sharing state name that is empty or too long.
func (r Rule) badShare() bool {
	return r.shared && (r.share == "" || len(r.share) > MaxRuleName)
}

// stateName is the name of r's state: its Sharing name and the figures
// that make the unit of its level (kind, period, zone), or base, its name
// and all its figures.
func (r Rule) stateName(base string) string {
	if !r.shared {
		return base
	}
	return "shared/" + r.share + "/" + strconv.Itoa(int(r.kind)) + "/" + strconv.FormatInt(int64(r.Per/time.Microsecond), 10) + "/" + r.zoneName()
}

// zoneName is a calendar rule's zone, "" for the others.
func (r Rule) zoneName() string {
	if r.loc == nil {
		return ""
	}
	return r.loc.String()
}

// A ruleKind tells a funnel from the rules that count units otherwise.
type ruleKind uint8

const (
	kindFunnel ruleKind = iota
	kindWindow
	kindDay
	kindMonth
)

// MaxWindow is the largest n of a Window rule: a window stores the time of
// every unit it holds (at most 16 bytes each), so a key's state stays small.
const MaxWindow = 10_000

// Window returns the rule that admits at most n units in any window of
// length w: a sliding log, exact to the microsecond of the server's clock.
// Each unit taken is available again exactly w after it was taken, so a
// call denied by it can retry when the oldest units it needs leave the
// window (RetryAfter). A Refund gives back the newest units.
//
// Unlike AtMost, a funnel that spreads the units out, a window admits n
// units at once again as soon as the first n leave it: it bounds every
// window, and allows every burst the bound allows.
//
// The state of a window is the time of each unit in it (9 bytes or fewer
// each for a window of a day), so n is at most MaxWindow: a larger window
// (a million units) is refused with ErrInvalidRule; use a funnel or AtMost
// for it. A key with one window of n units takes at most about 16n + 250
// bytes of server memory (MEMORY USAGE): 152 bytes for Window(10, 24h)
// after 10 calls, 312 when its 10 units are spread over the day (the
// server stores a hash with a value over 64 bytes as a table). w must be a whole number of
// microseconds. The rule is named like "5 in 1h0m0s"; its Leak is n, and
// not used. Its Quota is n per w.
func Window(n int64, w time.Duration) Rule {
	return Rule{Name: strconv.FormatInt(n, 10) + " in " + w.String(), Capacity: n, Leak: n, Per: w, kind: kindWindow}
}

// AtMost returns the rule that admits at most n calls in every window
// [t, t+window), for every t, with the largest burst that allows: n at once,
// then one per window. A cooldown AtMost(1, time.Minute) admits the next call
// exactly one minute after the last.
//
// After the burst it admits one call per window, not n: AtMost(10, 24*time.Hour)
// admits 10 calls at once, and then one a day for as long as calls keep
// coming, however many are tried; it admits 10 at once again only after 10
// days without a call. For "n per period" as people say it, use Window (n
// again once the first n are a period old) or PerDay (n again at midnight).
//
// Why: a funnel of capacity C leaking one unit per window admits fewer than
// C+1 units in any window, since what goes in within a window is at most what
// fits (C) plus what leaks within it (less than one unit); and no rule with a
// burst above n can keep the bound. The rule is named like "5/1h0m0s".
func AtMost(n int64, window time.Duration) Rule {
	return Rule{Name: strconv.FormatInt(n, 10) + "/" + window.String(), Capacity: n, Leak: 1, Per: window}
}

// rule is a validated Rule in exact units: the level of a funnel is kept in
// unit-microseconds (units * per), so a leak of Leak units per Per is exactly
// `leak` per microsecond.
type rule struct {
	name string
	id   string // field of the rule in the state hash
	arg  any    // id boxed once, as a script argument
	per  int64  // µs: the size of one unit
	full int64  // Capacity * per
	leak int64  // per µs
	// window is a window rule's length in µs, 0 for a funnel. A window
	// counts units: per and leak are 1 and full is its n.
	window int64
	// cal is a calendar rule's zone and period, nil for the others. It
	// counts units too: per and leak are 1 and full is its n.
	cal *calendar
	// shared: the rule's state may hold what rules of other capacities
	// took (Rule.Sharing), more than full; its stored wait is 0 (no gate:
	// the gate of another capacity would be wrong for it).
	shared bool
}

// compile returns r in exact units, or an error matching ErrInvalidRule.
func (r Rule) compile() (rule, error) {
	bad := func(why string) (rule, error) {
		return rule{}, fmt.Errorf("%w: %q: %s", ErrInvalidRule, r.Name, why)
	}
	if why := r.invalid(); why != "" {
		return bad(why)
	}
	per := int64(r.Per / time.Microsecond)
	if r.kind == kindDay || r.kind == kindMonth {
		return r.compileCalendar(), nil
	}
	if r.kind == kindWindow {
		id := fieldOf(r.stateName(r.Name + "/window/" + strconv.FormatInt(r.Capacity, 10) + "/" + strconv.FormatInt(per, 10)))
		return rule{name: r.Name, id: id, arg: id, per: 1, full: r.Capacity, leak: 1, window: per, shared: r.shared}, nil
	}
	hi, full := bits.Mul64(uint64(r.Capacity), uint64(per))
	if hi != 0 || full > maxScaled {
		return bad("Capacity * Per (in µs) exceeds 2^61")
	}
	id := fieldOf(r.stateName(r.Name + "/" + strconv.FormatInt(r.Capacity, 10) + "/" + strconv.FormatInt(r.Leak, 10) + "/" + strconv.FormatInt(per, 10)))
	return rule{name: r.Name, id: id, arg: id, per: per, full: int64(full), leak: r.Leak, shared: r.shared}, nil
}

// invalid returns why a field of r is out of range, "" if none is. (Their
// product, Capacity * Per, is compile's to check.)
func (r Rule) invalid() string {
	if why := r.invalidCommon(); why != "" {
		return why
	}
	switch r.kind {
	case kindDay, kindMonth:
		return r.invalidCalendar()
	case kindWindow:
		return r.invalidWindow()
	}
	return r.invalidFunnel()
}

// invalidCommon returns why the fields every kind of rule uses (the name,
// a Sharing state, Capacity) are out of range, "" if none is.
func (r Rule) invalidCommon() string {
	switch {
	case r.Name == "" || len(r.Name) > MaxRuleName:
		return fmt.Sprintf("the name must have 1 to %d bytes", MaxRuleName)
	case r.badShare():
		return fmt.Sprintf("a Sharing state name must have 1 to %d bytes", MaxRuleName)
	case r.Capacity <= 0:
		return "Capacity must be positive"
	}
	return ""
}

// invalidWindow returns why window rule r, whose name and Capacity are
// positive, is out of range: a window's Leak is not used, unless its Per is
// out of range too (then it is judged as a funnel's).
func (r Rule) invalidWindow() string {
	switch {
	case r.Capacity > MaxWindow:
		return fmt.Sprintf("a window holds at most %d units", MaxWindow)
	case r.Per%time.Microsecond == 0 && r.Per >= time.Microsecond:
		return ""
	}
	return r.invalidFunnel()
}

// invalidFunnel returns why the Leak and Per of funnel rule r are out of
// range, "" if they are not.
func (r Rule) invalidFunnel() string {
	switch {
	case r.Leak <= 0:
		return "Leak must be positive"
	case r.Per < time.Microsecond:
		return "Per must be at least 1µs"
	case r.Per%time.Microsecond != 0:
		return "Per must be a whole number of microseconds"
	case r.Leak > maxScaled:
		return "Leak is too large"
	}
	return ""
}

// invalidCalendar returns why calendar rule r, whose name and Capacity are
// valid, is out of range, "" if it is not: a calendar's Leak and Per are
// not used.
func (r Rule) invalidCalendar() string {
	if r.Capacity > maxScaled {
		return "a calendar rule counts at most 2^61 units"
	}
	return ""
}

// fieldOf is the state hash's field of a rule, from its definition (name,
// Capacity, Leak, Per): 48 bits of its SHA-256 in 8 base64url characters,
// the same for the same rule in every process, another for any change of
// the rule (a funnel of other parameters starts empty), and short, since
// every active key stores it. Among the few rules of one key, two of 48
// random bits collide with a chance below 1e-13.
func fieldOf(definition string) string {
	sum := sha256.Sum256([]byte(definition))
	return base64.RawURLEncoding.EncodeToString(sum[:6])
}

// Validate reports whether rules can be used together in one call: at least
// one, each valid, no two with one name. Errors match ErrInvalidRule.
func Validate(rules ...Rule) error {
	_, err := compileRules(rules, Rule.compile)
	return err
}

// compileRules validates the rules of one call with compile.
func compileRules(rules []Rule, compile func(Rule) (rule, error)) ([]rule, error) {
	if len(rules) == 0 {
		return nil, fmt.Errorf("%w: no rules", ErrInvalidRule)
	}
	out := make([]rule, len(rules))
	for i, r := range rules {
		c, err := compile(r)
		if err != nil {
			return nil, err
		}
		if slices.ContainsFunc(out[:i], func(prev rule) bool { return prev.name == c.name }) {
			return nil, fmt.Errorf("%w: two rules named %q", ErrInvalidRule, c.name)
		}
		if j := slices.IndexFunc(out[:i], func(prev rule) bool { return prev.id == c.id }); j >= 0 {
			return nil, fmt.Errorf("%w: rules %q and %q share one state (Sharing)", ErrInvalidRule, out[j].name, c.name)
		}
		out[i] = c
	}
	return out, nil
}
