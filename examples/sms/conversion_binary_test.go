package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
)

// consoleCodes reads the codes the console provider of a running binary
// wrote to its stderr ("sms to=<E.164> text=...code is <code>...").
type consoleCodes struct {
	out   *lines
	seen  int
	codes map[string]string // the last code to each number
}

var consoleLine = regexp.MustCompile(`^sms to=(\+[0-9]+) text=.*code is ([0-9]{6})\b`)

// code returns the last code sent to the number to, waiting up to 10 s for
// its line.
func (c *consoleCodes) code(t *testing.T, to string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.out.mu.Lock()
		for ; c.seen < len(c.out.done); c.seen++ {
			if m := consoleLine.FindStringSubmatch(c.out.done[c.seen]); m != nil {
				c.codes[m[1]] = m[2]
			}
		}
		c.out.mu.Unlock()
		if code, ok := c.codes[to]; ok {
			return code
		}
		if time.Now().After(deadline) {
			t.Fatalf("no code sent to %s in 10 s", to)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The pumping simulation, against the binary on a miniredis whose clock the
// test moves: 400 sends, one every 2 s, to numbers of one prefix
// (+86 137 00) from 50 addresses, none verified, with the static limits
// raised out of the way; beside them, at the same rate, 400 sends to
// another prefix (+86 139 00) whose codes are 80% verified, 4 s to 30 s
// after they are sent. With the defaults (20 sends judged, 0.2, 1 h), the
// pumped prefix gets at most 20 codes plus a handful, counted on the
// console; the other is never refused. The pause is logged once, with no
// number, counted in /metrics, and ends on time.
func TestBinaryConversionPumping(t *testing.T) {
	b := testutil.Mini(t)
	b.Mini.SetTime(t0)
	p := startBinary(t, nil, "-redis", "redis://"+b.Mini.Addr()+"/0", "-redis-timeout", "10s", "-trust-proxy",
		"-ip-hourly", "1000", "-ip-daily", "1000", "-ip-verify-hourly", "100000",
		"-prefix-hourly", "100000", "-prefix-daily", "100000", "-daily-budget", "10000000",
		"-pools-off", "-daily-spend", "0") // the conversion guard alone: the pools would hold the pump at 16 (campaign_test.go)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	post := func(path, body, ip string) (int, reply, http.Header) {
		t.Helper()
		req, err := http.NewRequest("POST", p.base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Forwarded-For", ip)
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		defer res.Body.Close()
		var r reply
		if err := json.NewDecoder(res.Body).Decode(&r); err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		return res.StatusCode, r, res.Header
	}
	var now time.Duration
	at := func(d time.Duration) { b.Mini.FastForward(d - now); now = d; b.Mini.SetTime(t0.Add(d)) }
	pumped := func(i int) string { return fmt.Sprintf("+8613700%06d", i) }
	addr := func(i int) string { return fmt.Sprintf("203.0.113.%d", i%50) }
	codes := &consoleCodes{out: p.stderr, codes: map[string]string{}}

	const n, step = 400, 2 * time.Second // paused near step 166 (5m32s): 234 steps of the pause
	verifyAt := map[int][]int{}          // step -> the real users who verify then
	pump := map[string]int{}             // answers to the pumped prefix: 202, or the 429's rule
	var pausedAt time.Duration
	start := time.Now()
	for i := range n {
		at(time.Duration(i) * step)
		for _, u := range verifyAt[i] {
			body := fmt.Sprintf(`{"phone":%q,"code":%q}`, phoneN(u), codes.code(t, phoneN(u)))
			if status, r, _ := post("/api/sms/verify", body, addr(u)); status != http.StatusOK {
				t.Fatalf("verify of real user %d at %v = %d %+v", u, now, status, r)
			}
		}
		status, r, h := post("/api/sms/send", fmt.Sprintf(`{"phone":%q}`, pumped(i)), addr(i))
		switch {
		case status == http.StatusAccepted:
			pump["202"]++
		case status == http.StatusTooManyRequests && r.Scope == "prefix" && strings.HasPrefix(r.Rule, "conversion"):
			pump[r.Rule]++
			if r.Rule == ruleConversion && pausedAt == 0 {
				pausedAt = now
				if h.Get("Retry-After") != "3600" || r.RetryAfter == nil || *r.RetryAfter != 3600 {
					t.Fatalf("the pausing send: Retry-After %q, %+v; want 3600", h.Get("Retry-After"), r)
				}
			}
		default:
			t.Fatalf("send %d to the pumped prefix at %v = %d %+v; want 202 or the conversion guard's 429", i, now, status, r)
		}
		if status, r, _ := post("/api/sms/send", fmt.Sprintf(`{"phone":%q}`, phoneN(i)), addr(i+25)); status != http.StatusAccepted {
			t.Fatalf("send %d to the real users' prefix at %v = %d %+v; want 202", i, now, status, r)
		}
		if i%5 != 4 { // 4 in 5 verify, 2 to 15 steps later
			later := i + []int{2, 5, 10, 15}[i%4]
			verifyAt[later] = append(verifyAt[later], i)
		}
	}
	t.Logf("FIGURE conversion pumping | %d sends to one prefix, one every %v from 50 addresses, none verified | answers %v, paused at %v (%v)",
		n, step, pump, pausedAt, time.Since(start))
	if pump["202"] > 20+5 || pausedAt == 0 {
		t.Fatalf("the pumped prefix: %v, paused at %v; want at most 20 + 5 sent, then paused", pump, pausedAt)
	}

	// The pause ends on time.
	at(pausedAt + time.Hour - time.Millisecond)
	if status, r, h := post("/api/sms/send", fmt.Sprintf(`{"phone":%q}`, pumped(n)), addr(0)); status != http.StatusTooManyRequests ||
		r.Rule != ruleConversion || h.Get("Retry-After") != "1" {
		t.Fatalf("a send 1 ms before the pause ends = %d %+v, Retry-After %q; want 429 conversion, 1", status, r, h.Get("Retry-After"))
	}
	at(pausedAt + time.Hour)
	if status, r, _ := post("/api/sms/send", fmt.Sprintf(`{"phone":%q}`, pumped(n)), addr(0)); status != http.StatusAccepted {
		t.Fatalf("a send when the pause ends = %d %+v; want 202", status, r)
	}

	res, err := client.Get(p.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{"sms_conversion_pauses_total 1\n",
		`sms_denials_total{guard="conversion",rule="conversion"} ` + strconv.Itoa(pump[ruleConversion]+1) + "\n"} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	p.stop(t)

	sent := map[string]int{}
	var logs []string
	for _, line := range strings.Split(p.stderr.String(), "\n") {
		if m := consoleLine.FindStringSubmatch(line); m != nil {
			sent[m[1][:8]]++
			continue
		}
		logs = append(logs, line)
	}
	t.Logf("FIGURE conversion pumping | codes on the console: %d to +8613700 (pumped, 1 after the pause), %d to +8613900 (80%% verified)", sent["+8613700"], sent["+8613900"])
	if sent["+8613700"] != pump["202"]+1 || sent["+8613900"] != n {
		t.Fatalf("codes on the console: %v; want %d and %d", sent, pump["202"]+1, n)
	}
	all := strings.Join(logs, "\n")
	// Paused when 17 of the 20 codes had expired: the 3 outstanding could
	// not make the 4 verified that 0.2 of 20 needs.
	if want := `msg="prefix paused: its codes are not verified" prefix=+8613700 verified=0 judged=17 of=20 for=1h0m0s`; strings.Count(all, want) != 1 {
		t.Errorf("the logs lack the pause, once: %s\n%s", want, all)
	}
	if m := regexp.MustCompile(`13[79]00[0-9]{6}`).FindString(all); m != "" {
		t.Errorf("a number in the logs: %s", m)
	}
}
