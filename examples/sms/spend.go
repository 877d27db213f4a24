package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
)

// SpendConfig caps what the service spends on SMS in money, per calendar
// day of Config.BudgetZone, beside -daily-budget's count of messages. Each
// send is charged its destination's price (priceTable) in micros:
//
//   - spend: every send, at most Daily a day;
//   - spend-open: the sends to destinations that are not converting (see
//     pools.go: a prefix none of whose recent codes were verified, or too
//     few), at most Daily less the reserve: the reserve is left to the
//     destinations whose codes keep being verified, which a flood of sends
//     elsewhere cannot spend;
//   - country-share: those sends again, per country, at most its share a
//     day counted in money not (yet) verified: a verified code gives its
//     price back to its country's share, so a country whose codes are used
//     is never held by it, and one whose codes are not spends its own share
//     only, not the day's budget. A country's share is Share of Daily,
//     widened by its usual traffic: PerVerified of the price of each code
//     verified there in the last 24 hours (the pools' tally), in steps of
//     twice the last, up to 16 times Share (shareTiers): a busy country's
//     real users, a sixth of whose codes go unused, stay inside it, and a
//     flood of codes nobody verifies does not widen it.
type SpendConfig struct {
	Daily          micros // per calendar day; 0: the money guards are off
	ReservePPM     int64  // millionths of Daily kept for converting destinations
	SharePPM       int64  // millionths of Daily one country may spend unverified
	PerVerifiedPPM int64  // millionths of a verified code's price its country's share grows by
	PricesFile     string // read over the shipped prices.json
}

// defaultSpend is 100 units of the currency a day, half of it reserved
// for converting destinations, 5% of it (5.00) a country's unverified
// share, widened by half the price of each code verified there in the last
// 24 hours.
func defaultSpend() SpendConfig {
	return SpendConfig{Daily: 100_000_000, ReservePPM: 500_000, SharePPM: 50_000, PerVerifiedPPM: 500_000}
}

// shareTiers are the widths of a country's share: Share, then twice the
// last, up to 16 times (capped at Daily).
const shareTiers = 5

// spendFlags binds the money flags to c.
func spendFlags(fl *flag.FlagSet, c *SpendConfig) {
	fl.Func("daily-spend", "money the service spends on SMS per calendar day of -budget-tz, in units of the prices' currency "+
		"(default 100; 0: the money guards are off)", moneyFlag(&c.Daily))
	fl.Func("spend-reserve", "the part of -daily-spend only destinations whose codes are verified may spend (default 0.5)", ppmFlag(&c.ReservePPM))
	fl.Func("country-share", "the part of -daily-spend one country may spend on codes not verified, per day (default 0.05)", ppmFlag(&c.SharePPM))
	fl.Func("share-per-verified", "the part of a code's price its country's share grows by for each code verified there in the last 24 hours, "+
		"up to 16 times -country-share (default 0.5; 0: the share is fixed)", ppmFlag(&c.PerVerifiedPPM))
	fl.StringVar(&c.PricesFile, "prices", "", "a JSON file of prices per country, read over the shipped table (see prices.json)")
}

func moneyFlag(to *micros) func(string) error {
	return func(s string) (err error) {
		*to, err = parseMoney(s)
		return err
	}
}

// ppmFlag reads a fraction from 0 to 1, to 6 decimals, in millionths.
func ppmFlag(to *int64) func(string) error {
	return func(s string) error {
		m, err := parseMoney(s)
		if err != nil || m > 1_000_000 {
			return fmt.Errorf("%q: want a fraction from 0 to 1", s)
		}
		*to = int64(m)
		return nil
	}
}

func (c SpendConfig) enabled() bool { return c.Daily > 0 }

func (c SpendConfig) check() error {
	if !c.enabled() {
		return nil
	}
	if c.Daily > maxMoney || c.ReservePPM < 0 || c.ReservePPM >= 1_000_000 || c.SharePPM <= 0 || c.SharePPM > 1_000_000 ||
		c.PerVerifiedPPM < 0 || c.PerVerifiedPPM > 1_000_000 {
		return fmt.Errorf("%w: -daily-spend up to %s, -spend-reserve from 0 to below 1, -country-share above 0 to 1, -share-per-verified 0 to 1", errConfig, maxMoney)
	}
	if c.Daily.share(c.SharePPM) < 1 || c.Daily-c.Daily.share(c.ReservePPM) < 1 {
		return fmt.Errorf("%w: -daily-spend %s leaves nothing to a country's share or outside the reserve", errConfig, c.Daily)
	}
	return nil
}

// The money rules: all calendar days of zone, in micros.
func (c SpendConfig) spendRule(zone *time.Location) funnel.Rule {
	return named("spend", funnel.PerDay(int64(c.Daily), zone))
}

func (c SpendConfig) openRule(zone *time.Location) funnel.Rule {
	return named("spend-open", funnel.PerDay(int64(c.Daily-c.Daily.share(c.ReservePPM)), zone))
}

// shareRule is the share of tier t: Share of Daily times 2^t, at most
// Daily.
func (c SpendConfig) shareRule(zone *time.Location, t int) funnel.Rule {
	return named("country-share", funnel.PerDay(int64(min(c.Daily.share(c.SharePPM)<<t, c.Daily)), zone))
}

// shareTier is the tier of a country's share whose codes verified in the
// last 24 hours were verified, at price: the least whose share holds
// PerVerified of their price.
func (c SpendConfig) shareTier(price micros, verified int64) int {
	var want micros
	if verified > 0 && price > 0 {
		want = maxMoney
		if int64(price) <= int64(maxMoney)/verified {
			want = micros(int64(price) * verified).share(c.PerVerifiedPPM)
		}
	}
	base := c.Daily.share(c.SharePPM)
	for t := range shareTiers - 1 {
		if base<<t >= want {
			return t
		}
	}
	return shareTiers - 1
}

// shareTierKey is the context key of a share charge's tier, which the
// share guard's PlanOf reads.
type shareTierKey struct{}

// sharePlans are the share guard's tiers above the first, for guard.WithPlans:
// "x2", "x4", ...; the first is its rule (guard.WithRules). Each is a PerDay rule of one
// zone, so all keep one state in a country's key (guard.WithPlans): a
// country moved to a wider tier keeps what it spent.
func (c SpendConfig) sharePlans(zone *time.Location) map[string][]funnel.Rule {
	plans := map[string][]funnel.Rule{}
	for t := 1; t < shareTiers; t++ {
		plans[shareTierName(t)] = []funnel.Rule{c.shareRule(zone, t)}
	}
	return plans
}

func shareTierName(t int) string { return "x" + strconv.Itoa(1<<t) }

// shareTierOf is the share guard's PlanOf: the tier its charge put in ctx.
func shareTierOf(ctx context.Context, _ string) (string, error) {
	if t, _ := ctx.Value(shareTierKey{}).(int); t > 0 {
		return shareTierName(t), nil
	}
	return "", nil
}

// spendGuards are the three money guards of a Service.
type spendGuards struct {
	spend, open, share *guard.Guard
	limits             map[*guard.Guard]funnel.Rule // each guard's rule
}

// priced is a charge of n micros to a money guard: a price that no day of
// the guard's rule could hold is denied by that rule, as a day spent. A
// charge to a country's share names its tier (0: the first).
type priced struct {
	g    *guard.Guard
	rule funnel.Rule
	n    int64
	tier int
}

func (p priced) Allow(ctx context.Context, key string) (guard.Decision, error) {
	if p.n > p.rule.Capacity {
		return guard.Decision{Rule: p.rule.Name, RetryAfter: 24 * time.Hour}, nil
	}
	return p.g.AllowN(p.context(ctx), key, p.n)
}

// context is ctx with p's tier for the share guard's PlanOf; the first
// tier (and every charge to another guard) needs none.
func (p priced) context(ctx context.Context) context.Context {
	if p.tier == 0 {
		return ctx
	}
	return context.WithValue(ctx, shareTierKey{}, p.tier)
}

func (p priced) Refund(ctx context.Context, key string) error {
	if p.n > p.rule.Capacity {
		return nil
	}
	return p.g.RefundN(p.context(ctx), key, p.n)
}

// moneyCharges are the money guards' charges of a send to dest at price:
// spend, and for a destination that is not converting spend-open and its
// country's share, of the tier its codes verified in the last 24 hours
// (verified) give it.
func (s *Service) moneyCharges(dest destination, price micros, unproven bool, verified int64) []charge {
	if s.money == nil {
		return nil
	}
	m := s.money
	out := []charge{{"budget", priced{g: m.spend, rule: m.limits[m.spend], n: int64(price)}, budgetKey}}
	if unproven {
		out = append(out, charge{"budget", priced{g: m.open, rule: m.limits[m.open], n: int64(price)}, budgetKey},
			charge{"country", m.shareCharge(s.cfg, price, verified), dest.Region})
	}
	return out
}

// shareCharge is the charge of price to a country's share, whose codes
// verified in the last 24 hours were verified.
func (m *spendGuards) shareCharge(cfg Config, price micros, verified int64) priced {
	t := cfg.Spend.shareTier(price, verified)
	return priced{g: m.share, rule: cfg.Spend.shareRule(cfg.BudgetZone, t), n: int64(price), tier: t}
}

// newSpendGuards returns the money guards of s, or nil when they are off.
func newSpendGuards(s *Service) (*spendGuards, error) {
	c := s.cfg.Spend
	if !c.enabled() {
		return nil, nil
	}
	m := &spendGuards{limits: map[*guard.Guard]funnel.Rule{}}
	for _, g := range []struct {
		to     **guard.Guard
		name   string
		prefix string
		rule   funnel.Rule
	}{
		{&m.spend, "spend", "sms:spend:", c.spendRule(s.cfg.BudgetZone)},
		{&m.open, "spend-open", "sms:open:", c.openRule(s.cfg.BudgetZone)},
		{&m.share, "country-share", "sms:share:", c.shareRule(s.cfg.BudgetZone, 0)},
	} {
		opts := []guard.Option{
			guard.WithPrefix(g.prefix),
			guard.WithRules(g.rule),
			guard.WithFunnel(funnel.WithUniformCost()),
			guard.WithSecret(s.cfg.Secret),
			guard.WithTimeout(s.cfg.Timeout),
			guard.WithObserve(s.metrics.observe(g.name)),
		}
		if g.to == &m.share && c.PerVerifiedPPM > 0 { // a fixed share is one rule
			opts = append(opts, guard.WithPlans(c.sharePlans(s.cfg.BudgetZone), shareTierOf))
		}
		var err error
		*g.to, err = guard.New(s.client, opts...)
		if err != nil {
			return nil, err
		}
		m.limits[*g.to] = g.rule
	}
	return m, nil
}

// learnPrice takes the price the provider reported for a message to e164.
func (s *Service) learnPrice(e164, currency string, price micros) {
	dest, err := s.numbers.parse(e164, "", s.cfg.PrefixDigits)
	if err == nil && s.prices.learn(dest.Region, currency, price) {
		s.log.Info("price learnt from the provider", "country", dest.Region, "price", price.String(), "currency", currency)
	}
}
