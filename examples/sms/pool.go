package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/funnelguard/funnelguard/guard"
	"github.com/redis/go-redis/v9"
)

// The pools judge conversion where the signal is. A pumping campaign that
// sends about one code per prefix, to many prefixes, leaves each prefix
// too few codes to judge (the conversion guard's window is 20); pooled per
// country and per prefix group its codes are plainly not used. Per
// country, group and prefix the pools count, per hour of the last 24, the
// sends and the verified codes; each send is judged on them:
//
//   - a prefix that keeps converting (proven: a code verified today or
//     within Memory, and at least the bar of today's judged codes) is
//     judged on its own tally only: its sends are the reserve that an
//     attack elsewhere in its country cannot close. Real users' numbers
//     fall in the prefixes real users verified from before, over a month
//     nearly all of them however thinly spread; a pumping ring's, drawn
//     over the country's ranges, mostly do not;
//   - any other send is judged on its prefix, its group (the country code
//     and GroupDigits digits) and its country's sends to destinations that
//     are not proven;
//   - a scope is refused when the Wilson upper bound of its verified share
//     (at z) is below the bar: rule pooled-conversion when even every open
//     code verified would not lift it, pooled-conversion-pending until its
//     open codes are verified or expire. The bar is MinRate, or Relative of
//     what the country's codes usually convert, whichever is higher: a
//     small honest sample is never refused (0 of 5 is not proof), a
//     country whose users convert 85% refuses a campaign verifying 30%;
//   - a send to a destination that is not proven is refused (rule
//     velocity, scope country) when its country has sent Velocity times its
//     usual number of codes in the last 2 hours, and at least Floor.
//
// A refused send is not counted, so a refused campaign keeps its scope
// refused until its sends leave the window (24 h) or verified codes lift it.

// PoolConfig is the pools' policy.
type PoolConfig struct {
	Off         bool          // the pools are off
	GroupDigits int           // digits after the country code that make a prefix group
	MinRate     float64       // the bar's floor
	Relative    float64       // the bar: this part of the country's usual conversion
	Z           float64       // the confidence of the bound, in standard deviations
	Velocity    float64       // a country's 2 hours: at most this times its usual
	Floor       int64         // and at least this many sends
	Pause       time.Duration // how long a scope shown to be below the bar stays refused
	Memory      time.Duration // how long a verified code keeps its prefix known
}

// defaultPools: groups of 2 digits, bar max(0.2, 0.5 × usual) at z 1.96,
// velocity 3 × usual and at least 40 sends in 2 hours, pauses of 6 hours,
// prefixes known for 30 days after a verified code.
func defaultPools() PoolConfig {
	return PoolConfig{GroupDigits: 2, MinRate: 0.2, Relative: 0.5, Z: 1.645, Velocity: 3, Floor: 40, Pause: 6 * time.Hour,
		Memory: 30 * 24 * time.Hour}
}

func poolFlags(fl *flag.FlagSet, c *PoolConfig) {
	fl.BoolVar(&c.Off, "pools-off", c.Off, "turn off the pooled conversion and velocity guards (per country, prefix group, prefix)")
	fl.IntVar(&c.GroupDigits, "group-digits", c.GroupDigits, "digits after the country code that make a prefix group")
	fl.Float64Var(&c.MinRate, "pool-min-conversion", c.MinRate, "the pools' bar is at least this fraction of codes verified")
	fl.Float64Var(&c.Relative, "relative-conversion", c.Relative, "the pools' bar is at least this part of what the country's codes usually convert")
	fl.Float64Var(&c.Z, "conversion-confidence", c.Z, "a scope is refused when the upper bound of its conversion at this many standard deviations is below the bar")
	fl.Float64Var(&c.Velocity, "country-velocity", c.Velocity, "a country's codes of 2 hours: at most this many times its usual (to destinations not converting)")
	fl.Int64Var(&c.Floor, "velocity-floor", c.Floor, "the velocity limit is never below this many codes in 2 hours")
	fl.DurationVar(&c.Pause, "pool-pause", c.Pause, "how long a prefix, group or country whose codes are shown not to convert is refused")
	fl.DurationVar(&c.Memory, "prefix-memory", c.Memory, "how long a verified code keeps its prefix known (judged on its own while it converts), 24h to 8760h")
}

func (c PoolConfig) check(prefixDigits int) error {
	bad := func(what float64) bool { return math.IsNaN(what) || what < 0 }
	if c.Off {
		return nil
	}
	if c.GroupDigits < 0 || c.GroupDigits > prefixDigits || bad(c.MinRate) || c.MinRate > 1 || bad(c.Relative) || c.Relative > 1 ||
		bad(c.Z) || c.Z > 10 || bad(c.Velocity) || c.Velocity > 1000 || c.Floor < 1 || c.Pause < time.Second ||
		c.Memory < poolBuckets*poolBucket || c.Memory > 365*24*time.Hour {
		return fmt.Errorf("%w: pools: -group-digits 0 to -prefix-digits, conversions 0 to 1, confidence 0 to 10, velocity 0 to 1000, floor 1 or more, pause 1s or more, prefix memory 24h to 8760h", errConfig)
	}
	return nil
}

func (c PoolConfig) policy() poolPolicy {
	ppm := func(f float64) int64 { return int64(math.Round(f * 1e6)) }
	return poolPolicy{minPPM: ppm(c.MinRate), relativePPM: ppm(c.Relative), z: c.Z,
		velocityPPM: ppm(c.Velocity), floor: c.Floor, usualMin: 20}
}

const (
	poolBucket  = time.Hour // one bucket of the tallies
	poolBuckets = 24        // the window of usual conversion, and of a prefix's proof
	poolRecent  = 3         // the window a scope is judged on: a campaign is a change
	// poolIndex is the sorted set of the scopes refused lately (for the
	// operators), by the time of their last refusal; at most poolIndexMax.
	poolIndex    = "sms:pool:{refused}:index"
	poolWhy      = "sms:pool:{refused}:why" // member -> the last refusal, JSON
	poolIndexMax = 1000
)

// pools keeps the tallies in Redis: per country a hash slot of its own,
// {<region>}, holding the country's hashes (a: all sends, c: sends to
// destinations not proven) and those of its groups and prefixes (g:, p:
// and their HMAC). Fields s<hour> and v<hour>: sends and verified codes of
// the sends of that hour (hours since the epoch). The sorted set k holds
// the country's known prefixes (their HMAC) by the hour of their latest
// verified send: at most one member per prefix of the country, none older
// than Memory. Safe for concurrent use.
type pools struct {
	client  redis.UniversalClient
	policy  poolPolicy
	cfg     Config
	mac     func(parts ...string) []byte
	metrics *metrics
}

func newPools(s *Service) *pools {
	if s.cfg.Pools.Off {
		return nil
	}
	return &pools{client: s.client, policy: s.cfg.Pools.policy(), cfg: s.cfg, mac: s.codes.mac, metrics: s.metrics}
}

// scopeKeys are the keys of dest's tallies: country, unproven, group, prefix.
func (p *pools) scopeKeys(dest destination) []string {
	base := "sms:pool:{" + dest.Region + "}:"
	return []string{countryKey(dest.Region), base + "c", base + "g:" + p.id("g", p.group(dest)), base + "p:" + p.id("p", dest.Prefix)}
}

// countryKey is the key of region's tally.
func countryKey(region string) string { return "sms:pool:{" + region + "}:a" }

// knownKey is the sorted set of dest's country's known prefixes.
func knownKey(dest destination) string { return "sms:pool:{" + dest.Region + "}:k" }

// pauseKeys are the keys of the pauses of dest's scopes: prefix, group,
// country (each holds the refusal that paused it, as JSON).
func (p *pools) pauseKeys(dest destination) map[string]string {
	base := "sms:pool:{" + dest.Region + "}:x:"
	return map[string]string{"prefix": base + "p:" + p.id("p", dest.Prefix), "group": base + "g:" + p.id("g", p.group(dest)), "country": base + "c"}
}

func (p *pools) id(kind, of string) string {
	return base64.RawURLEncoding.EncodeToString(p.mac("pool "+kind, of))
}

// group is dest's prefix group: + the country code and GroupDigits digits.
func (p *pools) group(dest destination) string {
	cut := len(dest.Prefix) - (p.cfg.PrefixDigits - p.cfg.Pools.GroupDigits)
	return dest.Prefix[:max(1, min(len(dest.Prefix), cut))]
}

// read returns dest's view, its scopes' pauses (the refusal of each, by
// scope), and Redis's time.
func (p *pools) read(ctx context.Context, dest destination) (poolView, map[string]*poolRefusal, time.Time, error) {
	keys, pauseKeys := p.scopeKeys(dest), p.pauseKeys(dest)
	cmds := make([]*redis.MapStringStringCmd, len(keys))
	pauses := map[string]*redis.StringCmd{}
	var now *redis.TimeCmd
	var known *redis.FloatCmd
	_, err := p.client.Pipelined(ctx, func(pl redis.Pipeliner) error {
		now = pl.Time(ctx)
		known = pl.ZScore(ctx, knownKey(dest), p.id("p", dest.Prefix))
		for i, k := range keys {
			cmds[i] = pl.HGetAll(ctx, k)
		}
		for scope, k := range pauseKeys {
			pauses[scope] = pl.Get(ctx, k)
		}
		return nil
	})
	if err != nil && err != redis.Nil {
		return poolView{}, nil, time.Time{}, err
	}
	t := now.Val()
	recent := func(i int) tally { return p.tally(cmds[i].Val(), t, poolRecent) }
	v := poolView{country: p.tally(cmds[0].Val(), t, poolBuckets), unproven: recent(1), group: recent(2),
		prefix: recent(3), prefixDay: p.tally(cmds[3].Val(), t, poolBuckets),
		known: known.Err() == nil && int64(known.Val()) > hourOf(t.Add(-p.cfg.Pools.Memory))}
	v.recent, v.older = sendsByAge(cmds[0].Val(), hourOf(t))
	paused := map[string]*poolRefusal{}
	for scope, c := range pauses {
		var r poolRefusal
		if c.Err() == nil && json.Unmarshal([]byte(c.Val()), &r) == nil {
			paused[scope] = &r
		}
	}
	return v, paused, t, nil
}

// verifiedOf is how many codes to region were verified in the 24 hours
// before now.
func (p *pools) verifiedOf(ctx context.Context, region string, now time.Time) (int64, error) {
	fields, err := p.client.HGetAll(ctx, countryKey(region)).Result()
	return p.tally(fields, now, poolBuckets).Verified, err
}

func hourOf(t time.Time) int64 { return t.Unix() / int64(poolBucket/time.Second) }

// tally sums the fields of one hash over the last hours at now: a send is
// open while its hour's codes may live (the hour's end and a code TTL).
func (p *pools) tally(fields map[string]string, now time.Time, hours int64) tally {
	var t tally
	cur := hourOf(now)
	for h := cur - hours + 1; h <= cur; h++ {
		s, v := count(fields, "s", h), count(fields, "v", h)
		t.Sent += s
		t.Verified += v
		end := time.Unix((h+1)*int64(poolBucket/time.Second), 0).Add(p.cfg.CodeTTL)
		if end.After(now) {
			t.Open += max(0, s-v)
		}
	}
	t.Verified = min(t.Verified, t.Sent)
	return t
}

func count(fields map[string]string, kind string, hour int64) int64 {
	n, _ := strconv.ParseInt(fields[kind+strconv.FormatInt(hour, 10)], 10, 64)
	return max(n, 0)
}

// sendsByAge returns a country's sends of the hours cur and cur-1, and of
// the 22 hours before.
func sendsByAge(fields map[string]string, cur int64) (recent, older int64) {
	for h := cur - poolBuckets + 1; h <= cur; h++ {
		if h >= cur-1 {
			recent += count(fields, "s", h)
		} else {
			older += count(fields, "s", h)
		}
	}
	return recent, older
}

// add adds n to the field kind<hour> of dest's hashes: all of them for a
// send to a destination not proven, the country's and the prefix's
// otherwise.
func (p *pools) add(ctx context.Context, dest destination, kind string, hour int64, unproven bool, n int64) error {
	keys := p.scopeKeys(dest)
	if !unproven {
		keys = []string{keys[0], keys[3]}
	}
	field := kind + strconv.FormatInt(hour, 10)
	_, err := p.client.TxPipelined(ctx, func(pl redis.Pipeliner) error {
		for _, k := range keys {
			pl.HIncrBy(ctx, k, field, n)
			pl.Expire(ctx, k, poolBuckets*poolBucket+p.cfg.CodeTTL)
		}
		return nil
	})
	return err
}

// verified records a verified code of dest's send of hour: its prefix is
// known until Memory after that hour. The set drops the members older
// than that on each write.
func (p *pools) verified(ctx context.Context, dest destination, hour int64) error {
	key, memory := knownKey(dest), int64(p.cfg.Pools.Memory/poolBucket)
	_, err := p.client.TxPipelined(ctx, func(pl redis.Pipeliner) error {
		pl.ZAddGT(ctx, key, redis.Z{Score: float64(hour), Member: p.id("p", dest.Prefix)})
		pl.ZRemRangeByScore(ctx, key, "-inf", "("+strconv.FormatInt(hour-memory, 10))
		pl.Expire(ctx, key, p.cfg.Pools.Memory+poolBucket)
		return nil
	})
	return err
}

// refused records a refusal of scope, with its figures, for the
// operators' listing (GET /api/pools).
func (p *pools) refused(ctx context.Context, dest destination, r *poolRefusal, now time.Time) {
	member := r.Scope + "|" + dest.Region + "|"
	switch r.Scope {
	case "prefix":
		member += shownPrefix(dest)
	case "group":
		member += p.group(dest)
	}
	member += "|" + p.pauseKeys(dest)[r.Scope]
	why, _ := json.Marshal(r)
	_, _ = p.client.TxPipelined(ctx, func(pl redis.Pipeliner) error {
		pl.ZAdd(ctx, poolIndex, redis.Z{Score: float64(now.Unix()), Member: member})
		pl.HSet(ctx, poolWhy, member, why)
		pl.ZRemRangeByRank(ctx, poolIndex, 0, -poolIndexMax-1)
		pl.Expire(ctx, poolIndex, poolBuckets*poolBucket)
		pl.Expire(ctx, poolWhy, poolBuckets*poolBucket)
		return nil
	})
}

// pausedScope returns the pause that refuses a send: its prefix's, or, to
// a destination not proven, its group's or country's.
func pausedScope(paused map[string]*poolRefusal, unproven bool) *poolRefusal {
	for _, scope := range []string{"prefix", "group", "country"} {
		if r := paused[scope]; r != nil && (unproven || scope == "prefix") {
			return r
		}
	}
	return nil
}

// pause refuses r's scope for the Pause, with r's figures (the operators'
// "why").
func (p *pools) pause(ctx context.Context, dest destination, r *poolRefusal, now time.Time) {
	r.Until = now.Add(p.cfg.Pools.Pause)
	b, _ := json.Marshal(r)
	_ = p.client.Set(ctx, p.pauseKeys(dest)[r.Scope], b, p.cfg.Pools.Pause).Err()
}

// poolSend is one send as the pools see it: Allow judges and counts it,
// Refund takes the count back.
type poolSend struct {
	p        *pools
	dest     destination
	hour     int64
	unproven bool
	verified int64 // the country's codes verified in the last 24 hours
	refusal  *poolRefusal
}

func (ps *poolSend) Allow(ctx context.Context, _ string) (guard.Decision, error) {
	p := ps.p
	start := time.Now()
	v, paused, now, err := ps.p.read(ctx, ps.dest)
	if err != nil {
		p.metrics.redisErrors.Inc()
		return guard.Decision{Degraded: true}, err
	}
	ps.hour, ps.verified = hourOf(now), v.country.Verified
	ps.unproven, ps.refusal = p.policy.judge(v)
	p.metrics.latency.WithLabelValues("pools").Observe(time.Since(start).Seconds())
	if r := pausedScope(paused, ps.unproven); r != nil {
		ps.refusal = r
		p.metrics.denials.WithLabelValues("pools-"+r.Scope, r.Rule).Inc()
		return guard.Decision{Rule: r.Rule, RetryAfter: r.Until.Sub(now)}, nil
	}
	if r := ps.refusal; r != nil {
		p.metrics.denials.WithLabelValues("pools-"+r.Scope, r.Rule).Inc()
		p.refused(ctx, ps.dest, r, now)
		wait := p.cfg.CodeTTL
		if r.Rule != rulePooledPending {
			wait = time.Unix((ps.hour+1)*int64(poolBucket/time.Second), 0).Sub(now)
		}
		if r.Rule == rulePooled {
			wait = p.cfg.Pools.Pause
			p.pause(ctx, ps.dest, r, now)
		}
		return guard.Decision{Rule: r.Rule, RetryAfter: wait}, nil
	}
	if err := p.add(ctx, ps.dest, "s", ps.hour, ps.unproven, 1); err != nil {
		p.metrics.redisErrors.Inc()
		return guard.Decision{Degraded: true}, err
	}
	return guard.Decision{Allowed: true}, nil
}

func (ps *poolSend) Refund(ctx context.Context, _ string) error {
	return ps.p.add(ctx, ps.dest, "s", ps.hour, ps.unproven, -1)
}

// scope is the scope a refusal names.
func (ps *poolSend) scope() string {
	if ps.refusal == nil {
		return "prefix"
	}
	return ps.refusal.Scope
}

// A sendNote is what a code remembers of its send, for its verification:
// the pools' hour and whether its destination was proven, and its price.
type sendNote struct {
	hour     int64
	unproven bool
	price    micros
}

func (n sendNote) String() string {
	u := "0"
	if n.unproven {
		u = "1"
	}
	return strconv.FormatInt(n.hour, 10) + ":" + u + ":" + strconv.FormatInt(int64(n.price), 10)
}

func parseNote(s string) (sendNote, bool) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return sendNote{}, false
	}
	hour, err1 := strconv.ParseInt(parts[0], 10, 64)
	price, err2 := strconv.ParseInt(parts[2], 10, 64)
	return sendNote{hour: hour, unproven: parts[1] == "1", price: micros(price)}, err1 == nil && err2 == nil && price >= 0
}
