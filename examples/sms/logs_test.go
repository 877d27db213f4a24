package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// The service's logs hold no code, no secret, no MAC and no phone number.
// The binary runs on a redis-server of its own with a secret of the test's
// (SMS_SECRET), sends codes to numbers in several spellings, and answers
// right, wrong, reused and spent codes, throttled sends and bad numbers;
// after SIGTERM everything it wrote, but the console provider's messages
// (the one place a code and a number go, by design), is scanned.
func TestLogsHoldNoSecrets(t *testing.T) {
	srv := testutil.StartServer(t)
	secret := "logs test secret " + rand.Text()
	// A Redis timeout for a loaded machine: the product's 500 ms would make
	// a stall a 503 and fail a test that is about logs.
	p := startBinary(t, []string{"SMS_SECRET=" + secret}, "-redis", "redis://"+srv.Addr+"/0", "-redis-timeout", "10s", "-countries", "CN,GB,FR")
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections() // no keep-alive goroutine outlives the test
	post := func(path, body string, want int) {
		t.Helper()
		res, err := client.Post(p.base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != want {
			t.Fatalf("POST %s %s = %d %s; want %d\nstderr:\n%s", path, body, res.StatusCode, b, want, p.stderr)
		}
	}
	codeOf := func(e164 string) string {
		t.Helper()
		re := regexp.MustCompile(`^sms to=` + regexp.QuoteMeta(e164) + ` text=.*code is ([0-9]{6})\b`)
		return p.stderr.await(t, re, p.exited)[1]
	}
	// secrets are the strings no log may hold.
	secrets := []string{secret, hex.EncodeToString([]byte(secret)),
		base64.StdEncoding.EncodeToString([]byte(secret)), base64.RawURLEncoding.EncodeToString([]byte(secret))}
	var codes []string
	// stored adds the keys and values in Redis to secrets: the MACs of the
	// numbers and of the codes.
	stored := func() {
		ctx := context.Background()
		keys, err := rdb.Keys(ctx, "sms:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			secrets = append(secrets, k)
			if mac, err := rdb.HGet(ctx, k, "m").Result(); err == nil {
				secrets = append(secrets, mac)
			}
		}
	}

	for _, n := range []struct{ spelling, other, e164, national string }{
		{"+44 7400 123456", "＋４４７４００１２３４５６", uk, "7400123456"},
		{"138 0013 8000", "+86 138-0013-8000", number, "13800138000"},
		{"+33 6 12 34 56 78", "0033 612345678", "+33612345678", "612345678"},
	} {
		secrets = append(secrets, n.spelling, n.other, n.e164, n.e164[1:], n.national)
		send := fmt.Sprintf(`{"phone":%q}`, n.spelling)
		post("/api/sms/send", send, http.StatusAccepted)
		code := codeOf(n.e164)
		codes = append(codes, code)
		stored()
		verify := func(code string) string { return fmt.Sprintf(`{"phone":%q,"code":%q}`, n.other, code) }
		post("/api/sms/verify", verify(wrong(code, 0)), http.StatusUnauthorized)
		post("/api/sms/verify", verify(code), http.StatusOK)
		post("/api/sms/verify", verify(code), http.StatusUnauthorized)
		post("/api/sms/send", send, http.StatusTooManyRequests)
		post("/api/sms/send", fmt.Sprintf(`{"phone":%q}`, n.e164+"\x00"), http.StatusBadRequest)
		post("/api/sms/verify", fmt.Sprintf(`{"phone":%q,"code":%q}`, n.e164, secret), http.StatusBadRequest)
	}
	// A code spent by wrong guesses.
	spent := phoneN(7)
	secrets = append(secrets, spent, spent[1:], spent[3:])
	post("/api/sms/send", fmt.Sprintf(`{"phone":%q}`, spent), http.StatusAccepted)
	code := codeOf(spent)
	codes = append(codes, code)
	stored()
	for i := range 6 {
		post("/api/sms/verify", fmt.Sprintf(`{"phone":%q,"code":%q}`, spent, wrong(code, i)), http.StatusUnauthorized)
	}
	post("/api/sms/verify", fmt.Sprintf(`{"phone":%q,"code":%q}`, spent, code), http.StatusUnauthorized)
	p.stop(t)

	var logs []string
	for line := range strings.SplitSeq(p.stderr.String()+p.stdout.String(), "\n") {
		if !strings.HasPrefix(line, "sms to=") {
			logs = append(logs, line)
		}
	}
	all := strings.Join(logs, "\n")
	// The logs are not empty: they name the numbers, masked.
	for _, want := range []string{`msg="code sent" to=+44******3456`, `msg="code sent" to=+86*******8000`, "shutting down"} {
		if !strings.Contains(all, want) {
			t.Fatalf("the logs lack %s:\n%s", want, all)
		}
	}
	// Numbers are found however they are punctuated.
	compact := strings.NewReplacer(" ", "", "-", "", ".", "", "(", "", ")", "").Replace(all)
	for _, s := range secrets {
		if strings.Contains(all, s) || strings.Contains(compact, s) {
			t.Errorf("the logs hold %q:\n%s", s, all)
		}
	}
	for _, c := range codes {
		if regexp.MustCompile(`(^|[^0-9])` + c + `([^0-9]|$)`).MatchString(all) {
			t.Errorf("the logs hold the code %s:\n%s", c, all)
		}
	}
}
