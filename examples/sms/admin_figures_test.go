package main

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
)

// A paused prefix is listed with its figures, shown in its numbers' state,
// and resumed, by id or by prefix: its sends go out again.
func TestAdminPausedPrefixes(t *testing.T) {
	a := newAdminEnv(t, conversionOn, judging5)
	var list struct {
		Conversion bool           `json:"conversion"`
		Paused     []pausedPrefix `json:"paused"`
	}
	a.api("GET", "/api/prefixes", "", &list)
	if !list.Conversion || len(list.Paused) != 0 {
		t.Fatalf("before any pause: %+v", list)
	}
	pause := func() {
		for i := range 5 {
			a.want(a.send(phoneN(i), from(i)...), http.StatusAccepted, fmt.Sprintf("send %d", i+1))
			if ok, err := a.svc.undelivered(t.Context(), phoneN(i)); !ok || err != nil {
				t.Fatalf("undelivered %d = %v, %v", i, ok, err)
			}
		}
		a.wantConversion(a.send(phoneN(5), from(5)...), ruleConversion, 3600, "6th send, 5 undelivered")
	}
	pause()
	raw := a.api("GET", "/api/prefixes", "", &list).raw
	if len(list.Paused) != 1 {
		t.Fatalf("paused: %s; want +8613900", raw)
	}
	p := list.Paused[0]
	if p.Prefix != "+8613900" || p.Verified != 0 || p.Judged != 5 || p.Left != 3600 || !p.Until.Equal(t0.Add(time.Hour)) {
		t.Fatalf("paused %+v; want +8613900, 0 of 5 verified, 3600 s left, until %v", p, t0.Add(time.Hour))
	}
	if st, raw := a.state(phoneN(7)); !st.PrefixPaused || st.PrefixPauseLeft != 3600 {
		t.Fatalf("a number of the paused prefix: %s", raw)
	}
	if st, raw := a.state(number); st.PrefixPaused {
		t.Fatalf("a number of another prefix: %s", raw)
	}
	var res struct {
		Resumed bool `json:"resumed"`
	}
	a.api("POST", "/api/prefixes/resume", `{"id":"`+p.ID+`"}`, &res)
	if !res.Resumed {
		t.Fatal("resume by id: not resumed")
	}
	a.want(a.send(phoneN(5), from(5)...), http.StatusAccepted, "a send after the resume")
	a.api("GET", "/api/prefixes", "", &list)
	if len(list.Paused) != 0 {
		t.Fatalf("after the resume: %+v", list)
	}
	a.api("POST", "/api/prefixes/resume", `{"id":"`+p.ID+`"}`, &res)
	if res.Resumed {
		t.Fatal("resume of a prefix not paused: resumed")
	}

	// Paused again (a resume empties the window: 5 sends more), resumed by
	// prefix.
	for i := range 5 {
		a.want(a.send(phoneN(10+i), from(i)...), http.StatusAccepted, "send")
		_, _ = a.svc.undelivered(t.Context(), phoneN(10+i))
	}
	a.wantConversion(a.send(phoneN(20), from(1)...), ruleConversion, 3600, "paused again")
	a.api("POST", "/api/prefixes/resume", `{"prefix":"+8613900"}`, &res)
	if !res.Resumed {
		t.Fatal("resume by prefix: not resumed")
	}
	a.want(a.send(phoneN(20), from(1)...), http.StatusAccepted, "a send after the resume by prefix")
	for _, bad := range []string{`{}`, `{"prefix":"8613900"}`, `{"id":"x"}`, `{"prefix":"+86 139"}`} {
		if r := a.call("POST", "/api/prefixes/resume", "Bearer "+adminToken, bad); r.status != http.StatusBadRequest {
			t.Fatalf("resume %s = %v; want 400", bad, r)
		}
	}
	if n, err := a.svc.client.Exists(t.Context(), a.svc.conversion.indexKey()).Result(); err != nil || n != 0 {
		t.Fatalf("the index of pauses outlives them: %d, %v", n, err)
	}
}

// An ended pause leaves the list, and the index expires with it.
func TestAdminPauseEnds(t *testing.T) {
	a := newAdminEnv(t, conversionOn, judging5)
	c := &clock{e: a.env}
	for i := range 5 {
		a.want(a.send(phoneN(i), from(i)...), http.StatusAccepted, "send")
		_, _ = a.svc.undelivered(t.Context(), phoneN(i))
	}
	a.wantConversion(a.send(phoneN(5), from(5)...), ruleConversion, 3600, "paused")
	ttl := a.b.Mini.TTL(a.svc.conversion.indexKey())
	if ttl <= 0 || ttl > time.Hour {
		t.Fatalf("the index's TTL = %v; want the pause's, 1 h", ttl)
	}
	c.to(time.Hour)
	var list struct {
		Conversion bool           `json:"conversion"`
		Paused     []pausedPrefix `json:"paused"`
	}
	a.api("GET", "/api/prefixes", "", &list)
	if len(list.Paused) != 0 || a.b.Mini.Exists(a.svc.conversion.indexKey()) {
		t.Fatalf("an ended pause is listed: %+v", list)
	}
}

// The budget's figures after N sends: used N, left the rest; its day and
// its end in its zone.
func TestAdminBudget(t *testing.T) {
	shanghai, err := time.LoadLocation("Asia/Shanghai")
	if err != nil {
		t.Fatal(err)
	}
	a := newAdminEnv(t, noIPLimits, func(c *Config) { c.DailyBudget, c.BudgetZone = 10, shanghai })
	var b budgetState
	a.api("GET", "/api/budget", "", &b)
	if b.Used != 0 || b.Left != 10 || b.Limit != 10 {
		t.Fatalf("before any send: %+v", b)
	}
	for i := range 3 {
		a.want(a.send(phoneN(i)), http.StatusAccepted, "send")
	}
	a.want(a.send(phoneN(0)), http.StatusTooManyRequests, "a send denied (cooldown) costs no budget")
	raw := a.api("GET", "/api/budget", "", &b).raw
	// t0 is 2026-01-01 12:00 UTC, 20:00 in Shanghai: the day ends in 4 h.
	end := time.Date(2026, 1, 2, 0, 0, 0, 0, shanghai)
	if b.Used != 3 || b.Left != 7 || b.Zone != "Asia/Shanghai" || b.Day != "2026-01-01" || !b.ResetsAt.Equal(end) || b.ResetsIn != 4*3600 {
		t.Fatalf("after 3 sends: %s; want 3 used, 7 left, Asia/Shanghai's 2026-01-01, resetting at %v in 4 h", raw, end)
	}
	for i := range 7 {
		a.want(a.send(phoneN(10+i)), http.StatusAccepted, "send")
	}
	a.want(a.send(phoneN(20)), http.StatusTooManyRequests, "the 11th send")
	a.api("GET", "/api/budget", "", &b)
	if b.Used != 10 || b.Left != 0 {
		t.Fatalf("after the budget: %+v; want 10 used, 0 left", b)
	}
	a.at(4 * time.Hour) // midnight in Shanghai
	raw = a.api("GET", "/api/budget", "", &b).raw
	if b.Used != 0 || b.Left != 10 || b.Day != "2026-01-02" || b.ResetsIn != 24*3600 {
		t.Fatalf("the next day: %s", raw)
	}
}

// On a Redis Cluster: the pauses of two prefixes (keys of two hash slots)
// are listed, a number's state read and reset, a prefix resumed by id.
func TestAdminCluster(t *testing.T) {
	c := testutil.Cluster(t)
	// A secret of its own, each run: the cluster is shared, by other tests
	// that send to these numbers and by the runs of -count.
	secret := []byte("admin cluster test " + rand.Text())
	e := newEnvOn(t, c.Client(t), conversionOn, judging5, func(c *Config) { c.Secret = secret })
	a := &adminEnv{env: e, admin: httptest.NewServer(e.svc.AdminHandler(adminToken))}
	t.Cleanup(a.admin.Close)
	for _, prefix := range []string{"+86136", "+86137"} {
		for i := range 5 {
			p := fmt.Sprintf("%s%08d", prefix, i)
			a.want(a.send(p, from(i)...), http.StatusAccepted, "send")
			if _, err := a.svc.undelivered(t.Context(), p); err != nil {
				t.Fatal(err)
			}
		}
		a.wantConversion(a.send(prefix+"00000009", from(9)...), ruleConversion, 3600, "paused")
	}
	var list struct {
		Conversion bool           `json:"conversion"`
		Paused     []pausedPrefix `json:"paused"`
	}
	raw := a.api("GET", "/api/prefixes", "", &list).raw
	if len(list.Paused) != 2 || list.Paused[0].Prefix != "+8613600" || list.Paused[1].Prefix != "+8613700" {
		t.Fatalf("paused %s; want +8613600 and +8613700", raw)
	}
	if st, raw := a.state("+8613600000000"); !st.PrefixPaused || !st.CodeOutstanding || guardOf(t, st, "number").Allowed {
		t.Fatalf("state %s; want paused, a code outstanding, in the cooldown", raw)
	}
	a.reset("+8613600000000")
	var res struct {
		Resumed bool `json:"resumed"`
	}
	a.api("POST", "/api/prefixes/resume", `{"id":"`+list.Paused[0].ID+`"}`, &res)
	if !res.Resumed {
		t.Fatal("not resumed")
	}
	a.want(a.send("+8613600000000", from(1)...), http.StatusAccepted, "a send after the reset and the resume")
	var b budgetState
	a.api("GET", "/api/budget", "", &b)
	if b.Used != 11 {
		t.Fatalf("budget %+v; want 11 used", b)
	}
}
