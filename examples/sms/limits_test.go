package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// phoneN returns the i-th of a series of distinct valid numbers, in E.164.
func phoneN(i int) string { return fmt.Sprintf("+86139%08d", i) }

// The second code within the cooldown is refused with the wait, rounded up
// to whole seconds, and admitted once the cooldown has passed.
func TestCooldown(t *testing.T) {
	e := newEnv(t, noIPLimits)
	r := e.send(number)
	e.want(r, http.StatusAccepted, "first send")
	if r.body.RetryAfter == nil || *r.body.RetryAfter != 60 {
		t.Fatalf("first send = %v; want retry_after 60", r)
	}

	for _, s := range []struct {
		at   time.Duration
		want int64 // Retry-After
	}{
		{0, 60},
		{10*time.Second + 300*time.Millisecond, 50}, // 49.7 s left
		{59*time.Second + 999*time.Millisecond, 1},  // 1 ms left
	} {
		e.at(s.at)
		r := e.send(number)
		e.want(r, http.StatusTooManyRequests, fmt.Sprintf("send at +%v", s.at))
		if got := e.retryAfter(r, fmt.Sprintf("send at +%v", s.at)); got != s.want {
			t.Fatalf("send at +%v: Retry-After %d; want %d", s.at, got, s.want)
		}
	}
	if got := e.denials("phone", "cooldown"); got != 3 {
		t.Fatalf("cooldown denials = %v; want 3", got)
	}
	e.at(time.Minute)
	e.want(e.send(number), http.StatusAccepted, "send after the cooldown")
}

// The 6th code to one number within an hour is refused by the hourly rule.
func TestHourlyLimit(t *testing.T) {
	e := newEnv(t, noIPLimits)
	const gap = 61 * time.Second // past the cooldown
	for i := range 5 {
		e.at(time.Duration(i) * gap)
		e.want(e.send(number), http.StatusAccepted, fmt.Sprintf("send %d", i+1))
	}
	e.at(5 * gap)
	r := e.send(number)
	e.want(r, http.StatusTooManyRequests, "6th send within an hour")
	// The hourly window has room again when the first send is an hour old.
	if got, want := e.retryAfter(r, "6th send"), int64(time.Hour/time.Second)-int64(5*gap/time.Second); got != want {
		t.Fatalf("6th send: Retry-After %d; want %d", got, want)
	}
	if got := e.denials("phone", "hourly"); got != 1 {
		t.Fatalf("hourly denials = %v; want 1 (cooldown %v, daily %v)", got,
			e.denials("phone", "cooldown"), e.denials("phone", "daily"))
	}
	e.at(time.Hour)
	e.want(e.send(number), http.StatusAccepted, "send an hour after the first")
}

// The 11th code to one number within 24 hours is refused by the daily rule,
// though the hourly rule has room; once the first codes are a day old, the
// number gets as many again at once (a window, not a funnel that would
// give one a day).
func TestDailyLimit(t *testing.T) {
	e := newEnv(t, noIPLimits)
	var times []time.Duration // 5 at once (a cooldown apart), then one an hour
	for i := range 5 {
		times = append(times, time.Duration(i)*61*time.Second)
	}
	for h := 1; h <= 5; h++ {
		times = append(times, time.Duration(h)*time.Hour)
	}
	for i, at := range times {
		e.at(at)
		e.want(e.send(number), http.StatusAccepted, fmt.Sprintf("send %d at +%v", i+1, at))
	}
	e.at(6 * time.Hour)
	r := e.send(number)
	e.want(r, http.StatusTooManyRequests, "11th send within 24 h")
	// The daily window (10 in any 24 h) has room again when the first
	// send is a day old.
	if got, want := e.retryAfter(r, "11th send"), int64(18*time.Hour/time.Second); got != want {
		t.Fatalf("11th send: Retry-After %d; want %d", got, want)
	}
	if d, h := e.denials("phone", "daily"), e.denials("phone", "hourly"); d != 1 || h != 0 {
		t.Fatalf("denials: daily %v, hourly %v; want 1, 0", d, h)
	}
	for i := range 5 { // the first 5, a day later: all of them again
		at := 24*time.Hour + time.Duration(i)*61*time.Second
		e.at(at)
		e.want(e.send(number), http.StatusAccepted, fmt.Sprintf("send at +%v", at))
	}
	e.at(24*time.Hour + 5*61*time.Second)
	r = e.send(number)
	e.want(r, http.StatusTooManyRequests, "a 6th in the hour")
	if got := e.retryAfter(r, "a 6th in the hour"); got != 3600-5*61 {
		t.Fatalf("a 6th in the hour: Retry-After %d; want %d, the hourly window's", got, 3600-5*61)
	}
}

// One client address gets 10 codes an hour and 30 a day, whatever the
// numbers; IPv6 addresses count by /64.
func TestIPLimits(t *testing.T) {
	trust := func(c *Config) { c.TrustProxy = true }
	from := func(ip string) []string { return []string{"X-Forwarded-For", ip} }

	t.Run("hourly and daily", func(t *testing.T) {
		e := newEnv(t, trust)
		next := 0
		send := func(ip string) response {
			next++
			return e.send(phoneN(next), from(ip)...)
		}
		for i := range 10 {
			e.want(send("203.0.113.7"), http.StatusAccepted, fmt.Sprintf("send %d", i+1))
		}
		r := send("203.0.113.7")
		e.want(r, http.StatusTooManyRequests, "11th send from one address within an hour")
		if got := e.retryAfter(r, "11th send"); got != 3600 { // one unit leaks an hour
			t.Fatalf("11th send: Retry-After %d; want 3600", got)
		}
		if got := e.denials("ip", "ip-hourly"); got != 1 {
			t.Fatalf("ip-hourly denials = %v; want 1", got)
		}
		e.want(send("203.0.113.8"), http.StatusAccepted, "send from another address")

		// One an hour more, up to 30 in the day.
		for h := 1; h <= 20; h++ {
			e.at(time.Duration(h) * time.Hour)
			e.want(send("203.0.113.7"), http.StatusAccepted, fmt.Sprintf("send %d", 10+h))
		}
		e.at(21 * time.Hour)
		r = send("203.0.113.7")
		e.want(r, http.StatusTooManyRequests, "31st send from one address within 24 h")
		// The daily funnel (30, leaking one a day) has room again at t0+24h.
		if got := e.retryAfter(r, "31st send"); got != 3*3600 {
			t.Fatalf("31st send: Retry-After %d; want %d", got, 3*3600)
		}
		if got := e.denials("ip", "ip-daily"); got != 1 {
			t.Fatalf("ip-daily denials = %v; want 1", got)
		}
	})

	t.Run("IPv6 by /64", func(t *testing.T) {
		e := newEnv(t, trust)
		for i := range 10 {
			e.want(e.send(phoneN(i), from("2001:db8:1:2::1")...), http.StatusAccepted, fmt.Sprintf("send %d", i+1))
		}
		r := e.send(phoneN(10), from("2001:db8:1:2:ffff:ffff:ffff:ffff")...)
		e.want(r, http.StatusTooManyRequests, "send from another address of the same /64")
		e.want(e.send(phoneN(11), from("2001:db8:1:3::1")...), http.StatusAccepted, "send from the next /64")
	})

	// Without TrustProxy, X-Forwarded-For is the client's to write: ignored.
	t.Run("untrusted X-Forwarded-For", func(t *testing.T) {
		e := newEnv(t)
		for i := range 10 {
			ip := fmt.Sprintf("198.51.100.%d", i)
			e.want(e.send(phoneN(i), from(ip)...), http.StatusAccepted, fmt.Sprintf("send %d", i+1))
		}
		e.want(e.send(phoneN(10), from("198.51.100.99")...), http.StatusTooManyRequests, "11th send from 127.0.0.1")
	})
}

// A send refused for its number gives its address's unit back: an address
// is charged only for codes it could have caused.
func TestDeniedPhoneRefundsIP(t *testing.T) {
	e := newEnv(t)
	e.want(e.send(number), http.StatusAccepted, "first send")
	for i := range 20 {
		e.want(e.send(number), http.StatusTooManyRequests, fmt.Sprintf("repeat %d", i+1))
	}
	if got := e.denials("ip", "ip-hourly"); got != 0 {
		t.Fatalf("ip-hourly denials = %v; want 0", got)
	}
	for i := range 9 { // the address's 2nd to 10th unit
		e.want(e.send(phoneN(i)), http.StatusAccepted, fmt.Sprintf("send to number %d", i))
	}
	e.want(e.send(phoneN(9)), http.StatusTooManyRequests, "the address's 11th code")
}
