package main

import (
	"fmt"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
)

// Config is the service's policy; every field has a flag (see main.go).
type Config struct {
	Region           string        // default region for numbers without +<country>
	Cooldown         time.Duration // between two sends to one number
	PhoneHourly      int64         // sends per number per hour
	PhoneDaily       int64         // sends per number per 24 h
	IPHourly         int64         // sends per client IP (IPv6: /64) per hour
	IPDaily          int64         // sends per client IP per 24 h
	CodeTTL          time.Duration // how long a code is valid
	MaxAttempts      int64         // wrong guesses that invalidate a code
	MaxDailyFailures int64         // failed verifications per number per 24 h, across codes
	Secret           []byte        // HMAC key for codes and stored numbers
	Timeout          time.Duration // per Redis call
	TrustProxy       bool          // take the client IP from X-Forwarded-For
}

// DefaultConfig returns the policy of the issue: cooldown 60 s, 5 per hour,
// 10 per day per number; 10 per hour, 30 per day per IP; 6-digit codes valid
// 5 minutes, 5 attempts, 10 failures per number per day.
func DefaultConfig() Config {
	return Config{
		Region: "CN", Cooldown: time.Minute, PhoneHourly: 5, PhoneDaily: 10,
		IPHourly: 10, IPDaily: 30, CodeTTL: 5 * time.Minute, MaxAttempts: 5,
		MaxDailyFailures: 10, Timeout: 500 * time.Millisecond,
	}
}

func (c Config) phoneRules() []funnel.Rule {
	return []funnel.Rule{
		{Name: "cooldown", Capacity: 1, Leak: 1, Per: c.Cooldown},
		{Name: "hourly", Capacity: c.PhoneHourly, Leak: 1, Per: time.Hour},
		{Name: "daily", Capacity: c.PhoneDaily, Leak: 1, Per: 24 * time.Hour},
	}
}

func (c Config) ipRules() []funnel.Rule {
	return []funnel.Rule{
		{Name: "ip-hourly", Capacity: c.IPHourly, Leak: 1, Per: time.Hour},
		{Name: "ip-daily", Capacity: c.IPDaily, Leak: 1, Per: 24 * time.Hour},
	}
}

func (c Config) failureRule() funnel.Rule {
	return funnel.Rule{Name: "verify-failures", Capacity: c.MaxDailyFailures, Leak: 1, Per: 24 * time.Hour}
}

func (c Config) check() error {
	if len(c.Secret) < 16 {
		return fmt.Errorf("the secret must have at least 16 bytes")
	}
	if c.CodeTTL < time.Second || c.MaxAttempts < 1 || c.Timeout <= 0 {
		return fmt.Errorf("code TTL, attempts and timeout must be positive")
	}
	for _, rs := range [][]funnel.Rule{c.phoneRules(), c.ipRules(), {c.failureRule()}} {
		if err := funnel.Validate(rs...); err != nil {
			return err
		}
	}
	return nil
}
