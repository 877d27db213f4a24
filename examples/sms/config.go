package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
)

// Config is the service's policy; every field has a flag (see main.go).
type Config struct {
	Region           string         // default region for numbers without +<country>
	Countries        []string       // regions whose numbers are texted; empty: Region only; {"*"}: all
	PrefixDigits     int            // digits after the country code that make a destination prefix
	PrefixHourly     int64          // sends per destination prefix per hour
	PrefixDaily      int64          // sends per destination prefix per 24 h
	DailyBudget      int64          // sends of the whole service per calendar day: the cost cap
	BudgetZone       *time.Location // the budget's day runs from midnight to midnight here; nil: UTC
	IPVerifyHourly   int64          // verifications per client IP per hour
	Cooldown         time.Duration  // between two sends to one number
	PhoneHourly      int64          // sends per number in any hour
	PhoneDaily       int64          // sends per number in any 24 h
	IPHourly         int64          // sends per client IP (IPv6: /64) per hour
	IPDaily          int64          // sends per client IP per 24 h
	CodeTTL          time.Duration  // how long a code is valid
	MaxAttempts      int64          // wrong guesses that invalidate a code
	MaxDailyFailures int64          // failed verifications per number per 24 h, across codes
	Secret           []byte         // HMAC key for codes and stored numbers
	Timeout          time.Duration  // per Redis call
	TrustProxy       bool           // take the client IP from X-Forwarded-For
	DemoOutbox       bool           // serve the console provider's outbox to the page
	ProviderTimeout  time.Duration  // bounds each call to the SMS provider
	// ProviderInFlight bounds the calls to the provider running at once
	// across the fleet (0: no bound); a send waits ProviderInFlightWait at
	// most for one to end.
	ProviderInFlight     int64
	ProviderInFlightWait time.Duration

	Conversion ConversionConfig // the conversion guard (conversion.go)
	Spend      SpendConfig      // the money guards (spend.go)
	Pools      PoolConfig       // pooled conversion and velocity (pool.go)
}

// DefaultConfig returns the default policy: mobile numbers of CN only;
// cooldown 60 s, 5 in any hour, 10 in any 24 h per number; 10 per hour, 30
// per day per IP; 30 per hour, 200 per day per destination prefix of 5
// digits; 1,000 per calendar day (UTC) for the whole service; 6-digit codes valid 5 minutes, 5 attempts,
// 10 failures per number per day, 30 verifications per IP per hour.
func DefaultConfig() Config {
	return Config{
		Region: "CN", Cooldown: time.Minute, PhoneHourly: 5, PhoneDaily: 10,
		IPHourly: 10, IPDaily: 30, PrefixDigits: 5, PrefixHourly: 30, PrefixDaily: 200,
		DailyBudget: 1000, IPVerifyHourly: 30, CodeTTL: 5 * time.Minute, MaxAttempts: 5,
		MaxDailyFailures: 10, Timeout: 500 * time.Millisecond,
		ProviderTimeout: 5 * time.Second, ProviderInFlight: 10, ProviderInFlightWait: 2 * time.Second,
		Conversion: defaultConversion(), Spend: defaultSpend(), Pools: defaultPools(),
	}
}

// inFlightWait is how long a send may wait for a provider call to end:
// ProviderInFlightWait, or nothing when the calls are not bounded.
func (c Config) inFlightWait() time.Duration {
	if c.ProviderInFlight == 0 {
		return 0
	}
	return c.ProviderInFlightWait
}

// phoneRules are a number's limits: a cooldown between two codes, and
// PhoneHourly in any hour and PhoneDaily in any 24 h, as sliding windows: a
// person who needed 5 codes this hour gets 5 again once they are an hour
// old, not one an hour (see funnel.AtMost and funnel.Window).
func (c Config) phoneRules() []funnel.Rule {
	return []funnel.Rule{
		named("cooldown", funnel.AtMost(1, c.Cooldown)),
		named("hourly", funnel.Window(c.PhoneHourly, time.Hour)),
		named("daily", funnel.Window(c.PhoneDaily, 24*time.Hour)),
	}
}

// named returns r named name: the rule of a 429's body and of the metrics.
func named(name string, r funnel.Rule) funnel.Rule {
	r.Name = name
	return r
}

func (c Config) ipRules() []funnel.Rule {
	return []funnel.Rule{
		{Name: "ip-hourly", Capacity: c.IPHourly, Leak: 1, Per: time.Hour},
		{Name: "ip-daily", Capacity: c.IPDaily, Leak: 1, Per: 24 * time.Hour},
	}
}

func (c Config) prefixRules() []funnel.Rule {
	return []funnel.Rule{
		{Name: "prefix-hourly", Capacity: c.PrefixHourly, Leak: 1, Per: time.Hour},
		{Name: "prefix-daily", Capacity: c.PrefixDaily, Leak: 1, Per: 24 * time.Hour},
	}
}

// budgetRule is the service's daily cost cap: at most DailyBudget sends per
// calendar day in BudgetZone, as a finance team reads a daily budget: all
// of it may go at any time of the day, and it comes back at local midnight
// (a day of 23 or 25 hours across a clock change; see funnel.PerDay).
func (c Config) budgetRule() funnel.Rule {
	return named("budget", funnel.PerDay(c.DailyBudget, c.BudgetZone))
}

// fromFlags sets the fields of c that flags give as text: -countries, a
// comma-separated list ("" keeps the default), and -budget-tz.
func (c *Config) fromFlags(countries, budgetTZ string) error {
	if countries != "" {
		c.Countries = strings.Split(countries, ",")
	}
	loc, err := budgetZone(budgetTZ)
	c.BudgetZone = loc
	return err
}

// budgetZone returns the zone of -budget-tz: an IANA name such as UTC or
// Asia/Shanghai (the binary embeds the zone database). "Local", the
// host's zone, is refused: the processes of a fleet must share one day.
func budgetZone(name string) (*time.Location, error) {
	loc, err := time.LoadLocation(name)
	if err != nil || name == "" || name == "Local" {
		return nil, fmt.Errorf("%w: -budget-tz %q: want an IANA time zone name such as UTC or Asia/Shanghai", errConfig, name)
	}
	return loc, nil
}

func (c Config) ipVerifyRules() []funnel.Rule {
	return []funnel.Rule{{Name: "ip-verify", Capacity: c.IPVerifyHourly, Leak: c.IPVerifyHourly, Per: time.Hour}}
}

func (c Config) failureRule() funnel.Rule {
	return funnel.Rule{Name: "verify-failures", Capacity: c.MaxDailyFailures, Leak: 1, Per: 24 * time.Hour}
}

// errConfig is the error, matched with errors.Is, of a Config that
// NewService refuses.
var errConfig = errors.New("invalid configuration")

func (c Config) check() error {
	if len(c.Secret) < 16 {
		return fmt.Errorf("%w: the secret must have at least 16 bytes", errConfig)
	}
	if c.CodeTTL < time.Second || c.MaxAttempts < 1 || c.Timeout <= 0 {
		return fmt.Errorf("%w: code TTL, attempts and timeout must be positive", errConfig)
	}
	if c.ProviderTimeout <= 0 {
		return fmt.Errorf("%w: the provider timeout must be positive", errConfig)
	}
	if c.ProviderInFlight < 0 || c.ProviderInFlight > 0 && c.ProviderInFlightWait <= 0 {
		return fmt.Errorf("%w: the provider's calls in flight must be 0 (no bound) or more, with a positive wait", errConfig)
	}
	if c.PrefixDigits < 1 || c.PrefixDigits > 14 {
		return fmt.Errorf("%w: prefix digits must be 1 to 14", errConfig)
	}
	if c.DailyBudget < 1 {
		return fmt.Errorf("%w: the daily budget must be positive", errConfig)
	}
	if err := c.Conversion.check(); err != nil {
		return err
	}
	if err := c.Spend.check(); err != nil {
		return err
	}
	if err := c.Pools.check(c.PrefixDigits); err != nil {
		return err
	}
	for _, rs := range [][]funnel.Rule{c.phoneRules(), c.ipRules(), c.prefixRules(), {c.budgetRule()}, c.ipVerifyRules(), {c.failureRule()}} {
		if err := funnel.Validate(rs...); err != nil {
			return fmt.Errorf("%w: %w", errConfig, err)
		}
	}
	return nil
}
