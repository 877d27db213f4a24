package main

import (
	"math"
	"time"
)

// A tally is what became of a scope's sends within the pools' window: sent,
// verified, and open (not verified, whose codes may live yet).
type tally struct {
	Sent     int64 `json:"sent"`
	Verified int64 `json:"verified"`
	Open     int64 `json:"open"`
}

// judged is how many sends have an outcome: verified, or expired unused.
func (t tally) judged() int64 { return t.Sent - t.Open }

// wilsonUpper is the upper end of the Wilson score interval of v successes
// in n trials at z standard deviations: the highest success rate that the
// sample does not rule out. n = 0 rules out nothing: 1.
func wilsonUpper(v, n int64, z float64) float64 {
	if n <= 0 {
		return 1
	}
	p, nf, z2 := float64(v)/float64(n), float64(n), z*z
	centre := p + z2/(2*nf)
	spread := z * math.Sqrt(p*(1-p)/nf+z2/(4*nf*nf))
	return (centre + spread) / (1 + z2/nf)
}

// poolPolicy is how the pools judge (see PoolConfig).
type poolPolicy struct {
	minPPM, relativePPM int64   // the bar: at least min, and relative of what the country usually converts
	z                   float64 // the bound's confidence
	velocityPPM, floor  int64   // a country's sends of the last two hours: at most velocity times its usual, and floor
	usualMin            int64   // judged sends a country needs before its usual rate counts
}

// A poolView is the tallies one send is judged on, and the country's sends
// per hour.
type poolView struct {
	country   tally // the country's sends of the day: its usual conversion
	prefixDay tally // the prefix's sends of the day: its proof
	known     bool  // a code to the prefix was verified within the memory (-prefix-memory)
	// The last hours' sends: the country's to destinations not proven, the
	// group's and the prefix's.
	unproven, group, prefix tally
	recent, older           int64 // the country's sends of the last 2 hours, and of the 22 before
}

// usualPPM is what country's codes usually convert, in millionths, or -1
// when it has too few judged sends to tell.
func (p poolPolicy) usualPPM(country tally) int64 {
	if country.judged() < p.usualMin {
		return -1
	}
	return min(country.Verified, country.judged()) * 1_000_000 / country.judged()
}

// usual is usualPPM as a fraction, or -1.
func (p poolPolicy) usual(country tally) float64 {
	if u := p.usualPPM(country); u >= 0 {
		return float64(u) / 1e6
	}
	return -1
}

// barPPM is the conversion a scope of the country must not be shown to be
// below: minPPM, or relativePPM of what the country usually converts.
func (p poolPolicy) barPPM(country tally) int64 {
	return max(p.minPPM, p.usualPPM(country)*p.relativePPM/1_000_000)
}

// proven reports a destination that keeps converting: a code to it
// verified today or within the memory (known), and as many of today's
// codes verified as the bar of those judged. Its sends spend the reserve
// and are not judged with the country's and group's others. Real users'
// numbers fall in the prefixes that real users verified from before; a
// pumping ring's, drawn over the country's ranges, mostly do not.
func proven(prefix tally, known bool, barPPM int64) bool {
	return (known || prefix.Verified > 0) && prefix.Verified*1_000_000 >= barPPM*prefix.judged()
}

// A poolRefusal says which scope and rule refused a send, with the figures.
type poolRefusal struct {
	Scope string    `json:"scope"` // prefix, group, country
	Rule  string    `json:"rule"`
	Tally tally     `json:"tally"`
	Upper float64   `json:"upper"`          // the optimistic estimate of its conversion (velocity: its sends)
	Bar   float64   `json:"bar"`            // the bar (velocity: the limit)
	Usual float64   `json:"usual"`          // what the country usually converts; -1 unknown
	Until time.Time `json:"until,omitzero"` // a pause's end
}

// The rules a pool refusal names.
const (
	rulePooled        = "pooled-conversion"         // even optimistic, the scope converts below the bar
	rulePooledPending = "pooled-conversion-pending" // it does unless open codes are verified
	ruleVelocity      = "velocity"                  // the country sends far above its usual rate
)

// judge decides a send on v: nil admits it; unproven reports that its
// destination is not converting (its sends are judged with the country's
// and spend outside the reserve).
func (p poolPolicy) judge(v poolView) (unproven bool, r *poolRefusal) {
	bar := p.barPPM(v.country)
	unproven = !proven(v.prefixDay, v.known, bar)
	type scoped struct {
		name string
		t    tally
	}
	scopes := []scoped{{"prefix", v.prefix}}
	if unproven {
		scopes = append(scopes, scoped{"group", v.group}, scoped{"country", v.unproven})
	}
	for _, s := range scopes {
		if r := p.below(s.name, s.t, bar); r != nil {
			r.Usual = p.usual(v.country)
			return unproven, r
		}
	}
	if limit := p.velocityLimit(v.older); unproven && v.recent >= limit {
		return unproven, &poolRefusal{Scope: "country", Rule: ruleVelocity, Tally: v.country,
			Upper: float64(v.recent), Bar: float64(limit), Usual: p.usual(v.country)}
	}
	return unproven, nil
}

// below refuses a scope whose optimistic conversion (open codes verified)
// is below the bar, or whose pessimistic one (open codes not) is.
func (p poolPolicy) below(scope string, t tally, barPPM int64) *poolRefusal {
	bar := float64(barPPM) / 1e6
	if up := wilsonUpper(t.Verified+t.Open, t.Sent, p.z); up < bar {
		return &poolRefusal{Scope: scope, Rule: rulePooled, Tally: t, Upper: up, Bar: bar}
	}
	if up := wilsonUpper(t.Verified, t.Sent, p.z); up < bar {
		return &poolRefusal{Scope: scope, Rule: rulePooledPending, Tally: t, Upper: up, Bar: bar}
	}
	return nil
}

// velocityLimit is how many sends a country may have in 2 hours, given the
// older of its 22 hours before: velocity times its usual 2 hours, at least
// floor.
func (p poolPolicy) velocityLimit(older int64) int64 {
	return max(p.floor, older*2*p.velocityPPM/(22*1_000_000))
}
