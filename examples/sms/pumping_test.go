package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/nyaruka/phonenumbers"
)

// ledger is what every guard of a send holds for one send's keys: the
// Decision Peek reports, which moves with any unit taken or given back.
type ledger map[string]guard.Decision

// ledger peeks at the four guards of a send to phone from ip.
func (e *env) ledger(phone, ip string) ledger {
	e.t.Helper()
	dest, err := e.svc.numbers.parse(phone, "", e.cfg.PrefixDigits)
	if err != nil {
		e.t.Fatal(err)
	}
	l := ledger{}
	for scope, c := range map[string]struct {
		g   *guard.Guard
		key string
	}{
		"ip": {e.svc.ip, ip}, "number": {e.svc.phone, dest.E164},
		"prefix": {e.svc.prefix, dest.Prefix}, "budget": {e.svc.budget, budgetKey},
	} {
		d, err := c.g.Peek(context.Background(), c.key)
		if err != nil {
			e.t.Fatal(err)
		}
		l[scope] = d
	}
	return l
}

// unchanged fails the test unless every guard holds what it held before.
func (e *env) unchanged(what string, before, after ledger) {
	e.t.Helper()
	for scope, d := range before {
		if after[scope] != d {
			e.t.Fatalf("%s: the %s guard went from %+v to %+v; want nothing taken from it", what, scope, d, after[scope])
		}
	}
}

// Numbers of one destination prefix share the prefix's limit, from any
// address; a send the prefix denies takes nothing from its address, its
// number or the budget; another prefix is not affected.
func TestPrefixLimit(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.TrustProxy, c.PrefixHourly, c.PrefixDaily = true, 3, 5 })
	from := func(i int) []string { return []string{"X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i)} }
	// +86 139 00 00xxxx: one prefix of 5 digits, 13900.
	for i := range 3 {
		e.want(e.send(phoneN(i), from(i)...), http.StatusAccepted, fmt.Sprintf("send %d to the prefix", i+1))
	}
	before := e.ledger(phoneN(3), "198.51.100.3")
	r := e.send(phoneN(3), from(3)...)
	e.want(r, http.StatusTooManyRequests, "4th send to the prefix within an hour")
	if r.body.Scope != "prefix" || r.body.Rule != "prefix-hourly" {
		t.Fatalf("4th send = %v; want scope prefix, rule prefix-hourly", r)
	}
	if got := e.retryAfter(r, "4th send"); got != 3600 {
		t.Fatalf("4th send: retry after %d s; want 3600 (a unit leaks an hour)", got)
	}
	e.unchanged("a send the prefix denied", before, e.ledger(phoneN(3), "198.51.100.3"))

	e.want(e.send("+8613800138000", from(9)...), http.StatusAccepted, "a send to another prefix (13800)")
	e.at(time.Hour)
	e.want(e.send(phoneN(3), from(3)...), http.StatusAccepted, "a send to the prefix an hour later")
	e.at(2 * time.Hour)
	e.want(e.send(phoneN(4), from(4)...), http.StatusAccepted, "the 5th of the day")
	e.at(3 * time.Hour)
	r = e.send(phoneN(5), from(5)...)
	e.want(r, http.StatusTooManyRequests, "the 6th of the day")
	if r.body.Scope != "prefix" || r.body.Rule != "prefix-daily" {
		t.Fatalf("6th send of the day = %v; want scope prefix, rule prefix-daily", r)
	}
	if got := len(e.sms.messages()); got != 6 {
		t.Fatalf("%d messages; want 6", got)
	}
}

// A send denied by any of the four guards takes nothing from any of them:
// the guards before the one that denied are refunded, those after it are
// never asked.
func TestDeniedSendTakesNothing(t *testing.T) {
	const (
		a, b = "192.0.2.1", "192.0.2.2"
		x    = "+8613800138000"
	)
	for _, tc := range []struct {
		scope     string
		limit     func(*Config)
		phone, ip string // the second send, denied by scope alone
	}{
		{"ip", func(c *Config) { c.IPHourly = 1 }, "+8615900001111", a},
		{"number", func(c *Config) {}, x, b},
		{"prefix", func(c *Config) { c.PrefixHourly = 1 }, "+8613800999999", b},
		{"budget", func(c *Config) { c.DailyBudget = 1 }, "+8615900001111", b},
	} {
		t.Run(tc.scope, func(t *testing.T) {
			e := newEnv(t, tc.limit, func(c *Config) { c.TrustProxy = true })
			e.want(e.send(x, "X-Forwarded-For", a), http.StatusAccepted, "first send")
			before := e.ledger(tc.phone, tc.ip)
			r := e.send(tc.phone, "X-Forwarded-For", tc.ip)
			e.want(r, http.StatusTooManyRequests, "second send")
			if r.body.Scope != tc.scope {
				t.Fatalf("second send = %v; want denied by scope %s", r, tc.scope)
			}
			e.unchanged("a send denied by "+tc.scope, before, e.ledger(tc.phone, tc.ip))
		})
	}
}

// The prefix is the country code and the configured number of digits.
func TestPrefixDigits(t *testing.T) {
	p, err := newNumberPolicy("CN", []string{"*"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		phone  string
		digits int
		want   string
	}{
		{"+8613800138000", 5, "+8613800"},
		{"+8613800138000", 3, "+86138"},
		{"+8613800138000", 14, "+8613800138000"},
		{"+14155552673", 6, "+1415555"},
		{"+447400123456", 4, "+447400"},
	} {
		d, err := p.parse(tc.phone, "", tc.digits)
		if err != nil || d.Prefix != tc.want {
			t.Errorf("prefix of %s with %d digits = %q, %v; want %q", tc.phone, tc.digits, d.Prefix, err, tc.want)
		}
	}
}

// The budget is the whole service's: at most DailyBudget sends per calendar
// day of BudgetZone, whatever the numbers and addresses, all of it at once if
// need be, and all of it again at local midnight: the 429 says when, to the
// second. A send it denies takes nothing from the other guards.
func TestDailyBudget(t *testing.T) {
	const budget = 48
	ny, err := budgetZone("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) { c.TrustProxy, c.DailyBudget, c.BudgetZone = true, budget, ny })
	from := func(i int) []string {
		return []string{"X-Forwarded-For", fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)}
	}
	phone := func(i int) string { return fmt.Sprintf("+86138%08d", i) }
	next := 0
	send := func() response {
		next++
		return e.send(phone(next), from(next)...)
	}

	// t0 is 07:00 EST: the day ends in 17 hours, at 05:00 UTC.
	for i := range budget {
		e.want(send(), http.StatusAccepted, fmt.Sprintf("send %d at once", i+1))
	}
	denied := next + 1
	before := e.ledger(phone(denied), from(denied)[1])
	r := send()
	e.want(r, http.StatusTooManyRequests, "a send past the day's budget")
	if r.body.Scope != "budget" || r.body.Rule != "budget" {
		t.Fatalf("send %d = %v; want scope budget, rule budget", budget+1, r)
	}
	if got := e.retryAfter(r, "past the budget"); got != 17*3600 {
		t.Fatalf("past the budget: Retry-After %d; want %d, until midnight in New York", got, 17*3600)
	}
	e.unchanged("a send the budget denied", before, e.ledger(phone(denied), from(denied)[1]))
	e.at(17*time.Hour - time.Second)
	if got := e.retryAfter(send(), "a second before midnight"); got != 1 {
		t.Fatalf("a second before midnight: Retry-After %d; want 1", got)
	}

	// Two days of a send every 15 minutes from midnight on (96 a day, twice
	// the budget): each day admits exactly its budget.
	perDay := map[string]int{}
	for m := 17 * time.Hour; m < 17*time.Hour+48*time.Hour; m += 15 * time.Minute {
		e.at(m)
		r := send()
		switch {
		case r.status == http.StatusAccepted:
			perDay[t0.Add(m).In(ny).Format(time.DateOnly)]++
		case r.status != http.StatusTooManyRequests || r.body.Scope != "budget":
			t.Fatalf("send at %v = %v; want 202 or the budget's 429", m, r)
		}
	}
	t.Logf("sends admitted per day in New York: %v (budget %d)", perDay, budget)
	if len(perDay) != 2 || perDay["2026-01-02"] != budget || perDay["2026-01-03"] != budget {
		t.Fatalf("sends per day %v; want %d on 2026-01-02 and 2026-01-03", perDay, budget)
	}
}

// -budget-tz takes an IANA zone name; anything else is a configuration
// error that names the flag, before the service starts.
func TestBudgetZoneFlag(t *testing.T) {
	if loc, err := budgetZone("Asia/Shanghai"); err != nil || loc.String() != "Asia/Shanghai" {
		t.Fatalf("Asia/Shanghai: %v, %v", loc, err)
	}
	for _, bad := range []string{"", "Local", "Mars/Olympus", "+08:00", "../etc/passwd"} {
		err := run(context.Background(), []string{"-budget-tz", bad}, io.Discard, io.Discard)
		if !errors.Is(err, errConfig) || !strings.Contains(err.Error(), "-budget-tz") {
			t.Errorf("-budget-tz %q: %v; want errConfig naming -budget-tz", bad, err)
		}
	}
	if r := DefaultConfig().budgetRule(); r.Name != "budget" || funnel.Validate(r) != nil {
		t.Fatalf("default budget rule %+v", r)
	}
}

// A burst of 1,000 sends to 100 premium-rate numbers from 50 addresses
// admits none, costs nothing and writes nothing, whatever the allow-list.
func TestPumpingBurst(t *testing.T) {
	var premium []string
	for n := 100; len(premium) < 100; n++ {
		e164 := fmt.Sprintf("+1900555%04d", n)
		num, err := phonenumbers.Parse(e164, "")
		if err != nil || phonenumbers.GetNumberType(num) != phonenumbers.PREMIUM_RATE {
			continue
		}
		premium = append(premium, e164)
	}
	for _, countries := range [][]string{nil, {"*"}, {"US"}} {
		t.Run(fmt.Sprint(countries), func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.TrustProxy, c.Countries = true, countries })
			statuses := map[int]int{}
			for i := range 1000 {
				r := e.send(premium[i%100], "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i%50))
				statuses[r.status]++
			}
			t.Logf("FIGURE pumping burst, countries %v | 1,000 sends to 100 premium-rate numbers from 50 addresses | statuses %v, %d messages",
				countries, statuses, len(e.sms.messages()))
			if statuses[http.StatusUnprocessableEntity] != 1000 {
				t.Fatalf("statuses %v; want 1,000 × 422", statuses)
			}
			if n := len(e.sms.messages()); n != 0 {
				t.Fatalf("%d messages; want none", n)
			}
			if _, n := e.strayKeys(); n != 0 {
				t.Fatalf("%d keys in Redis; want none", n)
			}
		})
	}
}
