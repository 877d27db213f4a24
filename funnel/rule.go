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
// every Per, so it admits a burst of Capacity, then one unit every
// Per/Leak: about Capacity + W*Leak/Per units in a window of length W
// (Quota gives the exact bound). Window, PerDay and PerMonth return rules
// that count units instead; their kind is not a field.
type Rule struct {
	// Name identifies the rule in a Result and in the stored state.
	Name string
	// Capacity is the most units the funnel holds: the largest burst.
	Capacity int64
	// Leak units drain out of the funnel every Per.
	Leak int64
	// Per is the leak period, a whole number of microseconds.
	Per time.Duration

	kind   ruleKind
	loc    *time.Location // a calendar rule's zone
	share  string         // the state's name, if shared (Sharing)
	shared bool
}

// Sharing returns r keeping its state under the name state instead of its
// own name and figures: rules of one kind and one Per (and zone) that share
// a state name keep one state in a key, whatever their Capacity and Leak,
// so a key moved to a smaller plan is decided on what the first rule took.
// state is 1 to MaxRuleName bytes; two rules of one call cannot share one.
func (r Rule) Sharing(state string) Rule {
	r.share, r.shared = state, true
	return r
}

// stateName is the name of r's state: base, or its Sharing name with the
// figures that make the unit of its level.
func (r Rule) stateName(base string) string {
	if !r.shared {
		return base
	}
	zone := "" // a calendar rule's
	if r.loc != nil {
		zone = r.loc.String()
	}
	return "shared/" + r.share + "/" + strconv.Itoa(int(r.kind)) + "/" + strconv.FormatInt(int64(r.Per/time.Microsecond), 10) + "/" + zone
}

// A ruleKind tells a funnel from the rules that count units otherwise.
type ruleKind uint8

const (
	kindFunnel ruleKind = iota
	kindWindow
	kindDay
	kindMonth
)

// MaxWindow is the largest n of a Window rule, which stores the time of
// every unit it holds.
const MaxWindow = 10_000

// Window returns the rule that admits at most n units in any window of
// length w, a whole number of microseconds: a sliding log on the server's
// clock. Each unit is available again exactly w after it was taken; a
// Refund gives back the newest units. n is at most MaxWindow. The rule is
// named like "5 in 1h0m0s"; its Leak is n, and not used.
func Window(n int64, w time.Duration) Rule {
	return Rule{Name: strconv.FormatInt(n, 10) + " in " + w.String(), Capacity: n, Leak: n, Per: w, kind: kindWindow}
}

// AtMost returns the funnel that admits at most n calls in every window
// [t, t+window), with the largest burst that allows: n at once, then one
// per window (a funnel of capacity n leaking one unit per window). For n
// again once a period has passed, use Window or PerDay. The rule is named
// like "5/1h0m0s".
func AtMost(n int64, window time.Duration) Rule {
	return Rule{Name: strconv.FormatInt(n, 10) + "/" + window.String(), Capacity: n, Leak: 1, Per: window}
}

// rule is a validated Rule in exact units: a funnel's level is kept in
// unit-microseconds (units * per), so it leaks exactly leak per µs. A
// window or calendar rule counts units: per and leak are 1, full is its n.
type rule struct {
	name   string
	id     string    // field of the rule in the state hash
	arg    any       // id boxed once, as a script argument
	per    int64     // µs: the size of one unit
	full   int64     // Capacity * per
	leak   int64     // per µs
	window int64     // a window's length in µs; 0 for the others
	cal    *calendar // a calendar rule's; nil for the others
	// shared: the state may hold more than full (Sharing), and keeps no
	// gate: another capacity's would be wrong for it.
	shared bool
	// grid is the step (ms) to which a key's expiry is rounded up for a
	// funnel's value (DESIGN.md); 0 (no rounding) for the others.
	grid int64
}

func (r Rule) compile() (rule, error) {
	if why := r.invalid(); why != "" {
		return rule{}, fmt.Errorf("%w: %q: %s", ErrInvalidRule, r.Name, why)
	}
	per := int64(r.Per / time.Microsecond)
	switch r.kind {
	case kindDay, kindMonth:
		return r.compileCalendar(), nil
	case kindWindow:
		id := fieldOf(r.stateName(r.Name + "/window/" + strconv.FormatInt(r.Capacity, 10) + "/" + strconv.FormatInt(per, 10)))
		return rule{name: r.Name, id: id, arg: id, per: 1, full: r.Capacity, leak: 1, window: per, shared: r.shared}, nil
	}
	full := r.Capacity * per // at most maxScaled (invalidFunnel)
	id := fieldOf(r.stateName(r.Name + "/" + strconv.FormatInt(r.Capacity, 10) + "/" + strconv.FormatInt(r.Leak, 10) + "/" + strconv.FormatInt(per, 10)))
	half := full / r.Leak / 2000 // ms
	grid := int64(1) << min(max(bits.Len64(uint64(half))-1, 0), maxGridLog)
	return rule{name: r.Name, id: id, arg: id, per: per, full: full, leak: r.Leak, shared: r.shared, grid: grid}, nil
}

// invalid returns why a field of r is out of range, "" if none is.
func (r Rule) invalid() string {
	if why := r.invalidCommon(); why != "" {
		return why
	}
	switch r.kind {
	case kindDay, kindMonth: // Leak and Per are not used
		if r.Capacity > maxScaled {
			return "a calendar rule counts at most 2^61 units"
		}
		return ""
	case kindWindow:
		return r.invalidWindow()
	}
	return r.invalidFunnel()
}

func (r Rule) invalidCommon() string {
	switch {
	case r.Name == "" || len(r.Name) > MaxRuleName:
		return fmt.Sprintf("the name must have 1 to %d bytes", MaxRuleName)
	case r.shared && (r.share == "" || len(r.share) > MaxRuleName):
		return fmt.Sprintf("a Sharing state name must have 1 to %d bytes", MaxRuleName)
	case r.Capacity <= 0:
		return "Capacity must be positive"
	}
	return ""
}

// invalidWindow checks a window, whose Leak is not used unless its Per is
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
	case r.Capacity > maxScaled/int64(r.Per/time.Microsecond): // Capacity > 0
		return "Capacity * Per (in µs) exceeds 2^61"
	}
	return ""
}

// fieldOf is a rule's field in the state hash: 48 bits of the SHA-256 of
// its definition, so a changed rule starts empty, in 8 base64url bytes.
func fieldOf(definition string) string {
	sum := sha256.Sum256([]byte(definition))
	return base64.RawURLEncoding.EncodeToString(sum[:6])
}

// Validate reports whether rules can be used together in one call: at least
// one, each valid, no two with one name. Errors match ErrInvalidRule.
func Validate(rules ...Rule) error {
	_, err := compileRules(rules, new(memo[Rule, rule]))
	return err
}

func compileRules(rules []Rule, cache *memo[Rule, rule]) ([]rule, error) {
	if len(rules) == 0 {
		return nil, fmt.Errorf("%w: no rules", ErrInvalidRule)
	}
	out := make([]rule, len(rules))
	for i, r := range rules {
		c, err := cache.get(r, r.compile)
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
