package main

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/base64"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/funnelguard/funnelguard/guard"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// The conversion guard: SMS pumping that passes every static rule (mobile
// numbers of an allowed country, sent slowly, from many addresses) still
// shows in one figure: its codes are never verified. Each destination
// prefix keeps its last sends and what became of them; a prefix whose
// codes stop converting is paused.

var (
	//go:embed conversion.lua
	conversionSrc    string
	conversionScript = redis.NewScript(conversionSrc)
	//go:embed conversion_outcome.lua
	outcomeSrc    string
	outcomeScript = redis.NewScript(outcomeSrc)
)

// ConversionConfig is the conversion guard's policy: a destination prefix
// whose last Sends sends cannot have MinRate of their codes verified is
// paused for Pause. Any of the three at 0 turns the guard off.
type ConversionConfig struct {
	MinRate float64       // the fraction of codes verified below which a prefix is paused, read to 6 decimals
	Sends   int64         // how many recent sends of a prefix are judged
	Pause   time.Duration // how long a prefix stays paused
}

// maxConversionSends bounds ConversionConfig.Sends: each send to a prefix
// reads its window, in one script.
const maxConversionSends = 1000

// defaultConversion is the default policy: a prefix is paused for an hour
// when fewer than 4 of its last 20 codes can be verified.
func defaultConversion() ConversionConfig {
	return ConversionConfig{MinRate: 0.2, Sends: 20, Pause: time.Hour}
}

// conversionFlags binds the policy's flags to c.
func conversionFlags(fl *flag.FlagSet, c *ConversionConfig) {
	fl.Float64Var(&c.MinRate, "min-conversion", c.MinRate, "the fraction of a destination prefix's codes that must be verified: "+
		"below it the prefix is paused (0: the conversion guard is off)")
	fl.Int64Var(&c.Sends, "conversion-sends", c.Sends, "how many recent sends of a destination prefix the conversion guard judges (0: off)")
	fl.DurationVar(&c.Pause, "conversion-pause", c.Pause, "how long a destination prefix whose codes stop converting is paused (0: off)")
}

func (c ConversionConfig) check() error {
	switch {
	case math.IsNaN(c.MinRate) || c.MinRate < 0 || c.MinRate > 1:
		return fmt.Errorf("%w: -min-conversion must be 0 (off) to 1", errConfig)
	case c.Sends < 0 || c.Sends > maxConversionSends:
		return fmt.Errorf("%w: -conversion-sends must be 0 (off) to %d", errConfig, maxConversionSends)
	case c.Pause < 0 || c.Pause > 0 && c.Pause < time.Second:
		return fmt.Errorf("%w: -conversion-pause must be 0 (off) or at least 1s", errConfig)
	}
	return nil
}

// need is how many of the last Sends codes must be verified: the least
// count that is not below MinRate of them, in integers (MinRate is read in
// millionths, so that 0.2 of 20 is 4, not 5 as 0.2 in binary would make it).
func (c ConversionConfig) need() int64 {
	ppm := int64(math.Round(c.MinRate * 1e6))
	return (ppm*c.Sends + 999_999) / 1_000_000
}

func (c ConversionConfig) enabled() bool { return c.need() > 0 && c.Pause > 0 }

// The rules a conversion 429 names (scope prefix).
const (
	ruleConversion        = "conversion"         // the prefix is paused
	ruleConversionPending = "conversion-pending" // its last codes must convert or expire first
)

// conversionWords is how a conversion 429 says why, for people.
var conversionWords = map[string]string{
	ruleConversion:        "codes sent to numbers like this one are not being used, so they are paused",
	ruleConversionPending: "the last codes sent to numbers like this one are not used yet",
}

// The replies of conversion.lua.
const (
	convAdmitted  = 1
	convPaused    = 2
	convPausedNow = 3
	convHeld      = 4
)

// conversionGuard pauses the destination prefixes whose codes stop
// converting. Per prefix it keeps, in Redis, the last Sends sends (time and
// id), what became of them (verified, undelivered) and the pause; the keys
// share the prefix's hash slot and expire. Safe for concurrent use.
type conversionGuard struct {
	client  redis.UniversalClient
	cfg     ConversionConfig
	need    int64
	codeTTL time.Duration
	keep    time.Duration // how long a send stays in its prefix's window
	timeout time.Duration // per Redis call
	mac     func(parts ...string) []byte
	metrics *metrics
	pauses  prometheus.Counter
	log     *slog.Logger
}

// newConversionGuard returns the conversion guard of s, or nil when its
// policy turns it off.
func newConversionGuard(s *Service) *conversionGuard {
	cfg := s.cfg.Conversion
	if !cfg.enabled() {
		return nil
	}
	c := &conversionGuard{client: s.client, cfg: cfg, need: cfg.need(), codeTTL: s.cfg.CodeTTL,
		keep: 24*time.Hour + s.cfg.CodeTTL, timeout: s.cfg.Timeout, mac: s.codes.mac, metrics: s.metrics, log: s.log,
		pauses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sms_conversion_pauses_total", Help: "Destination prefixes paused because their codes were not verified.",
		})}
	s.metrics.reg.MustRegister(c.pauses)
	return c
}

// keys returns the keys of prefix: its sends, their outcomes, its pause.
// The prefix is stored as an HMAC (its id), in braces: the three share a
// hash slot.
func (c *conversionGuard) keys(prefix string) []string { return conversionKeys(c.id(prefix)) }

// id is how prefix is stored: its HMAC, which also names it in the index
// of paused prefixes (pauseindex.go).
func (c *conversionGuard) id(prefix string) string {
	return base64.RawURLEncoding.EncodeToString(c.mac("conversion prefix", prefix))
}

// conversionKeys returns the keys of the prefix whose id is id.
func conversionKeys(id string) []string {
	base := "sms:conv:{" + id + "}:"
	return []string{base + "sends", base + "done", base + "pause"}
}

// tag is what the ids of the sends to a number start with: 8 bytes of its
// HMAC, so that an outcome reported by number finds its send.
func (c *conversionGuard) tag(e164 string) string {
	return base64.RawURLEncoding.EncodeToString(c.mac("conversion number", e164)[:8])
}

// send returns the charge of one send to dest: Allow decides it and
// records it, Refund takes the record back (the send did not happen).
func (c *conversionGuard) send(dest destination) *conversionSend {
	return &conversionSend{c: c, dest: dest, id: c.tag(dest.E164) + rand.Text()[:10]}
}

// conversionSend is one send to a prefix, as the conversion guard sees it.
type conversionSend struct {
	c    *conversionGuard
	dest destination
	id   string // the number's tag and 50 random bits
}

// Allow decides the send: admitted (and recorded), or denied because the
// prefix is paused (rule conversion) or its last codes have yet to convert
// or expire (rule conversion-pending). The key is not used: the send is the
// key. A pause is logged and counted by the send that makes it.
func (cs *conversionSend) Allow(ctx context.Context, _ string) (guard.Decision, error) {
	c := cs.c
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	start := time.Now()
	r, err := conversionScript.Run(ctx, c.client, c.keys(cs.dest.Prefix), cs.id, c.cfg.Sends, c.need,
		c.codeTTL.Microseconds(), c.cfg.Pause.Microseconds(), c.keep.Microseconds(), shownPrefix(cs.dest)).Int64Slice()
	c.metrics.latency.WithLabelValues("conversion").Observe(time.Since(start).Seconds())
	if err == nil && len(r) < 2 {
		err = fmt.Errorf("conversion.lua replied %v", r)
	}
	if err != nil {
		c.metrics.redisErrors.Inc()
		return guard.Decision{Degraded: true}, err
	}
	wait := time.Duration(r[1]) * time.Microsecond
	switch r[0] {
	case convAdmitted:
		return guard.Decision{Allowed: true}, nil
	case convHeld:
		c.metrics.denials.WithLabelValues("conversion", ruleConversionPending).Inc()
		return guard.Decision{RetryAfter: wait, Rule: ruleConversionPending}, nil
	case convPausedNow:
		c.pauses.Inc()
		c.indexPause(ctx, cs.dest, wait)
		c.log.Warn("prefix paused: its codes are not verified", "prefix", shownPrefix(cs.dest),
			"verified", figure(r, 2), "judged", figure(r, 3), "of", c.cfg.Sends, "for", wait.Round(time.Second).String())
		fallthrough
	case convPaused:
		c.metrics.denials.WithLabelValues("conversion", ruleConversion).Inc()
		return guard.Decision{RetryAfter: wait, Rule: ruleConversion}, nil
	}
	c.metrics.redisErrors.Inc()
	return guard.Decision{Degraded: true}, fmt.Errorf("conversion.lua replied %v", r)
}

func figure(r []int64, i int) int64 {
	if i < len(r) {
		return r[i]
	}
	return -1
}

// Refund takes the send's record back: it did not happen (another guard
// denied it, or the provider refused it).
func (cs *conversionSend) Refund(ctx context.Context, _ string) error {
	c := cs.c
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	keys := c.keys(cs.dest.Prefix)
	_, err := c.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRem(ctx, keys[0], cs.id)
		p.HDel(ctx, keys[1], cs.id)
		return nil
	})
	return err
}

// The outcomes a send can have, as conversion_outcome.lua takes them.
const (
	outcomeVerified    = "v"
	outcomeUndelivered = "u"
)

// outcome records what became of the last send to dest's number:
// outcomeVerified (its code was verified) or outcomeUndelivered (it did not
// reach the number: it counts as not converted at once, without waiting
// for its code to expire). It reports whether the prefix's window held a
// send to the number.
func (c *conversionGuard) outcome(ctx context.Context, dest destination, outcome string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	n, err := outcomeScript.Run(ctx, c.client, c.keys(dest.Prefix)[:2], c.tag(dest.E164), outcome, c.keep.Milliseconds()).Int()
	return n == 1, err
}

// resume ends the pause of prefix (as destination.Prefix holds it:
// "+8613800"), if any, and empties its window, so that its sends start
// afresh. It reports whether there was a pause to end. (For an operator's
// endpoint.)
func (c *conversionGuard) resume(ctx context.Context, prefix string) (bool, error) {
	return c.resumeID(ctx, c.id(prefix))
}

// resumeID is resume of the prefix whose id is id, which it also takes out
// of the index of paused prefixes.
func (c *conversionGuard) resumeID(ctx context.Context, id string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	keys := conversionKeys(id)
	if err := c.client.ZRem(ctx, c.indexKey(), id).Err(); err != nil {
		return false, err
	}
	var paused *redis.IntCmd
	_, err := c.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		paused = p.Del(ctx, keys[2])
		p.Del(ctx, keys[:2]...)
		return nil
	})
	return err == nil && paused.Val() == 1, err
}

// converted records that the code of the last send to dest was verified. A
// failure is logged, not answered: the code is used all the same.
func (s *Service) converted(ctx context.Context, dest destination) {
	if s.conversion == nil {
		return
	}
	if _, err := s.conversion.outcome(ctx, dest, outcomeVerified); err != nil {
		s.log.Warn("recording a verified code for the conversion guard failed", "prefix", shownPrefix(dest), "err", err)
	}
}

// undelivered records that the last send to the number e164 did not reach
// it (the provider's delivery report says failed or undelivered): it counts
// against its prefix's conversion at once. It reports whether the prefix's
// window held a send to the number.
func (s *Service) undelivered(ctx context.Context, e164 string) (bool, error) {
	if s.conversion == nil {
		return false, nil
	}
	dest, err := s.numbers.parse(e164, "", s.cfg.PrefixDigits)
	if err != nil {
		return false, err
	}
	return s.conversion.outcome(ctx, dest, outcomeUndelivered)
}

// shownPrefix is dest's prefix as logs and the pause record show it: as is
// when it leaves at least 4 digits of the number out, cut so that it does
// otherwise (with -prefix-digits 14 a prefix is a whole number).
func shownPrefix(dest destination) string {
	return dest.Prefix[:max(0, min(len(dest.Prefix), len(dest.E164)-4))]
}
