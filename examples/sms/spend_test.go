package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// moneyOn turns the money guards on with a day of 1.00 (testConfig turns
// them off), and the per-IP limits off.
func moneyOn(c *Config) {
	c.Spend = defaultSpend()
	c.Spend.Daily = 1_000_000
	c.TrustProxy = true
	noIPLimits(c)
}

// Amounts are read and written exactly, in micros.
func TestMoney(t *testing.T) {
	for in, want := range map[string]micros{"0.0079": 7900, "150": 150_000_000, "12.5": 12_500_000, ".3": 300_000, "0.000001": 1} {
		if got, err := parseMoney(in); err != nil || got != want {
			t.Errorf("parseMoney(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", ".", "-1", "+1", "0.0000001", "1e3", "abc", "99999999999"} {
		if _, err := parseMoney(bad); err == nil {
			t.Errorf("parseMoney(%q): no error", bad)
		}
	}
	if got := micros(7900).String(); got != "0.0079" {
		t.Errorf("7900 micros = %q", got)
	}
	if got := micros(100_000_000).share(50_000); got != 5_000_000 {
		t.Errorf("5%% of 100 = %d micros", got)
	}
}

// The day's spend is counted in money, with each destination's price: at
// 0.0463 a message (GB), a day of 1.00 sends 21 (0.9723), the 22nd is
// refused by rule spend; a send it refuses takes nothing from the other
// guards, and the cheaper country's sends fit what is left.
func TestDailySpend(t *testing.T) {
	e := newEnv(t, moneyOn, func(c *Config) { c.Spend.SharePPM = 1_000_000; c.Spend.ReservePPM = 0 })
	gb := func(i int) string { return fmt.Sprintf("+4474001%05d", i) }
	for i := range 21 {
		e.want(e.send(gb(i), "X-Forwarded-For", "192.0.2.1"), http.StatusAccepted, fmt.Sprintf("GB send %d", i+1))
	}
	r := e.send(gb(21), "X-Forwarded-For", "192.0.2.1")
	e.want(r, http.StatusTooManyRequests, "the GB send past 1.00")
	if r.body.Scope != "budget" || r.body.Rule != "spend" {
		t.Fatalf("the GB send past 1.00 = %v; want scope budget, rule spend", r)
	}
	e.want(e.send("+8613800138000", "X-Forwarded-For", "192.0.2.1"), http.StatusTooManyRequests, "a CN send at 0.05 (0.0277 left)")
}

// A country's codes that are not verified spend its share only; a verified
// code gives its price back.
func TestCountryShare(t *testing.T) {
	e := newEnv(t, moneyOn, func(c *Config) { c.Spend.SharePPM = 100_000; c.IPHourly = 3 }) // 0.10: two CN codes
	cn := func(i int) string { return fmt.Sprintf("+86138001%05d", i) }
	for i := range 2 {
		e.want(e.send(cn(i), "X-Forwarded-For", "192.0.2.1"), http.StatusAccepted, fmt.Sprintf("CN send %d", i+1))
	}
	r := e.send(cn(2), "X-Forwarded-For", "192.0.2.2")
	if r.status != http.StatusTooManyRequests || r.body.Scope != "country" || r.body.Rule != "country-share" {
		t.Fatalf("a 3rd unverified CN code = %v; want scope country, rule country-share", r)
	}
	e.want(e.send("+447400100001", "X-Forwarded-For", "192.0.2.2"), http.StatusAccepted, "a GB code: its own share")
	e.want(e.verify(cn(0), e.sms.code(t, cn(0))), http.StatusOK, "verify the 1st CN code")
	e.want(e.send(cn(2), "X-Forwarded-For", "192.0.2.2"), http.StatusAccepted, "a CN code once one was verified")
	e.want(e.send(cn(3), "X-Forwarded-For", "192.0.2.1"), http.StatusTooManyRequests, "a CN code with the share spent")
}

// Ten people behind one address, each verifying, are never refused by the
// address's 10 an hour: a verified code gives its unit back (five more
// get theirs). One address sending to numbers that never verify gets 10.
func TestSharedAddress(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.TrustProxy = true })
	const nat = "198.51.100.7"
	for i := range 15 {
		phone := fmt.Sprintf("+86138002%05d", i)
		e.want(e.send(phone, "X-Forwarded-For", nat), http.StatusAccepted, fmt.Sprintf("user %d behind the NAT", i+1))
		r := e.do("POST", "/api/sms/verify", map[string]string{"phone": phone, "code": e.sms.code(t, phone)}, "X-Forwarded-For", nat)
		e.want(r, http.StatusOK, fmt.Sprintf("user %d verifies", i+1))
	}
	sent := 0
	for i := range 30 {
		if e.send(fmt.Sprintf("+86138004%05d", i), "X-Forwarded-For", "203.0.113.9").status == http.StatusAccepted {
			sent++
		}
	}
	if sent != 10 {
		t.Fatalf("one address, numbers that never verify: %d sent; want 10", sent)
	}
}

// A country's share widens with its codes verified in the last 24 hours,
// by PerVerified of their price: five CN codes verified (5 x 0.05 x 0.5 =
// 0.125, over the share of 0.10) double it, and four unverified CN codes
// fit where two did; with -share-per-verified 0 it stays at two. The
// admin API shows the widened share.
func TestCountryShareGrowsWithVerified(t *testing.T) {
	for _, c := range []struct {
		perVerified int64
		fit         int
		shareCap    string
	}{{500_000, 4, "0.20"}, {0, 2, "0.10"}} {
		t.Run(fmt.Sprint(c.perVerified), func(t *testing.T) {
			e := newAdminEnv(t, moneyOn, func(cfg *Config) {
				cfg.Pools = defaultPools()
				cfg.Spend.SharePPM, cfg.Spend.PerVerifiedPPM = 100_000, c.perVerified // 0.10: two CN codes
			})
			for i := range 5 { // real users of one prefix, each code verified
				phone := fmt.Sprintf("+86138001%05d", i)
				e.want(e.send(phone, "X-Forwarded-For", "192.0.2.1"), http.StatusAccepted, fmt.Sprintf("CN send %d", i+1))
				e.want(e.verify(phone, e.sms.code(t, phone)), http.StatusOK, fmt.Sprintf("verify CN code %d", i+1))
			}
			for i := range c.fit { // codes nobody verifies, to a prefix not proven
				e.want(e.send(fmt.Sprintf("+86139002%05d", i), "X-Forwarded-For", "192.0.2.2"), http.StatusAccepted,
					fmt.Sprintf("unverified CN send %d", i+1))
			}
			r := e.send(fmt.Sprintf("+86139002%05d", c.fit), "X-Forwarded-For", "192.0.2.2")
			if r.status != http.StatusTooManyRequests || r.body.Scope != "country" || r.body.Rule != "country-share" {
				t.Fatalf("unverified CN send %d = %v; want scope country, rule country-share", c.fit+1, r)
			}
			var spend spendState
			e.api("GET", "/api/spend", "", &spend)
			if len(spend.Countries) != 1 || spend.Countries[0].ShareCap != c.shareCap || spend.Countries[0].Verified != 5 ||
				spend.Countries[0].ShareLeft != "0.00" {
				t.Fatalf("GET /api/spend countries = %+v; want CN with share %s, 5 verified, 0.00 left", spend.Countries, c.shareCap)
			}
		})
	}
}

// The tier of a share is the least that holds PerVerified of the verified
// codes' price, at most the last; no product overflows.
func TestShareTier(t *testing.T) {
	c := SpendConfig{Daily: 100_000_000, SharePPM: 50_000, PerVerifiedPPM: 500_000} // share 5.00
	for _, x := range []struct {
		price    micros
		verified int64
		want     int
	}{
		{50_000, 0, 0}, {50_000, 200, 0}, {50_000, 201, 1}, {50_000, 400, 1}, {50_000, 401, 2},
		{50_000, 3200, 4}, {50_000, 1 << 40, 4}, {maxMoney, 1 << 62, 4}, {0, 1000, 0},
	} {
		if got := c.shareTier(x.price, x.verified); got != x.want {
			t.Errorf("shareTier(%s, %d) = %d, want %d", x.price, x.verified, got, x.want)
		}
	}
	if got := c.shareRule(time.UTC, 4).Capacity; got != 80_000_000 {
		t.Errorf("the widest share = %d micros, want 80.00", got)
	}
	full := SpendConfig{Daily: 100_000_000, SharePPM: 1_000_000}
	if got := full.shareRule(time.UTC, 4).Capacity; got != 100_000_000 {
		t.Errorf("a share of the whole day, widened = %d micros, want the day's 100.00", got)
	}
}
