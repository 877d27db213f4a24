package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// A stranger's wrong guesses on a number that was never sent a code count
// against nothing of the number: after 10 (the daily failure budget), and
// 100 more from other addresses, its owner still gets a code and verifies.
func TestStrangerCannotLockOut(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.TrustProxy = true })
	for i := range 110 {
		r := e.do("POST", "/api/sms/verify", map[string]string{"phone": number, "code": pad6(i)},
			"X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i/10)) // 10 guesses an address
		e.want(r, http.StatusUnauthorized, fmt.Sprintf("stranger's guess %d", i+1))
	}
	if left := e.failuresLeft(number); left != e.cfg.MaxDailyFailures {
		t.Fatalf("daily failures left = %d after guesses with no code; want all %d", left, e.cfg.MaxDailyFailures)
	}
	e.want(e.send(number), http.StatusAccepted, "the owner's send")
	e.want(e.verify(number, e.sms.code(t, number)), http.StatusOK, "the owner's code")
}

// While a number is locked out of verification, a send is refused with the
// time left, and nothing is paid or counted; a guess without a code stays
// uncounted; once a failure leaks out, the number gets a code again.
func TestSendWhileLockedOut(t *testing.T) {
	e := newEnv(t, noIPLimits, func(c *Config) { c.MaxDailyFailures, c.MaxAttempts = 3, 5 })
	e.want(e.send(number), http.StatusAccepted, "send")
	code := e.sms.code(t, number)
	for i := range 3 {
		e.want(e.verify(number, wrong(code, i)), http.StatusUnauthorized, fmt.Sprintf("wrong guess %d", i+1))
	}
	r := e.verify(number, code)
	e.want(r, http.StatusTooManyRequests, "the right code past the failure budget")
	if r.body.Scope != "number" || r.body.Rule != "verify-failures" {
		t.Fatalf("the right code past the budget = %v; want scope number, rule verify-failures", r)
	}

	e.at(time.Hour)
	before := e.ledger(number, "127.0.0.1")
	r = e.send(number)
	e.want(r, http.StatusTooManyRequests, "a send while locked out")
	if r.body.Scope != "number" || r.body.Rule != "verify-failures" {
		t.Fatalf("a send while locked out = %v; want scope number, rule verify-failures", r)
	}
	if got, want := e.retryAfter(r, "a send while locked out"), int64(23*3600); got != want {
		t.Fatalf("a send while locked out: retry after %d s; want %d (a failure leaks a day after it was counted)", got, want)
	}
	e.unchanged("a send while locked out", before, e.ledger(number, "127.0.0.1"))
	if n := len(e.sms.messages()); n != 1 {
		t.Fatalf("%d messages; want 1", n)
	}

	e.at(24 * time.Hour)
	e.want(e.send(number), http.StatusAccepted, "a send once a failure leaked out")
	e.want(e.verify(number, e.sms.code(t, number)), http.StatusOK, "its code")
}

// Verifications are limited per address, whatever the number: one client
// cannot guess codes for everyone. Another address is not affected, and a
// denied verification counts nothing against the number.
func TestVerifyLimitPerIP(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.TrustProxy, c.IPVerifyHourly = true, 5 })
	e.want(e.send(number), http.StatusAccepted, "send")
	code := e.sms.code(t, number)
	from := func(ip string) []string { return []string{"X-Forwarded-For", ip} }
	for i := range 5 {
		r := e.do("POST", "/api/sms/verify", map[string]string{"phone": phoneN(i), "code": "123456"}, from("203.0.113.9")...)
		e.want(r, http.StatusUnauthorized, fmt.Sprintf("guess %d from one address", i+1))
	}
	r := e.do("POST", "/api/sms/verify", map[string]string{"phone": number, "code": wrong(code, 0)}, from("203.0.113.9")...)
	e.want(r, http.StatusTooManyRequests, "the 6th verification from one address in an hour")
	if r.body.Scope != "ip" || r.body.Rule != "ip-verify" {
		t.Fatalf("6th verification = %v; want scope ip, rule ip-verify", r)
	}
	if got := e.retryAfter(r, "6th verification"); got != 720 { // 5 an hour: one every 12 min
		t.Fatalf("6th verification: retry after %d s; want 720", got)
	}
	if left := e.failuresLeft(number); left != e.cfg.MaxDailyFailures {
		t.Fatalf("daily failures left = %d; want %d: the denied guess was never checked", left, e.cfg.MaxDailyFailures)
	}
	r = e.do("POST", "/api/sms/verify", map[string]string{"phone": number, "code": code}, from("203.0.113.10")...)
	e.want(r, http.StatusOK, "the owner's code from another address")
}
