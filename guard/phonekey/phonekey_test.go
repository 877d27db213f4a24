package phonekey_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/guard/phonekey"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

func TestNormalize(t *testing.T) {
	for _, tc := range []struct {
		raw, region, want string
	}{
		{"+86 136 0000 0009", "CN", "+8613600000009"},
		{"+86-136-0000-0009", "CN", "+8613600000009"},
		{"0086 13600000009", "CN", "+8613600000009"}, // CN's international prefix
		{"13600000009", "CN", "+8613600000009"},      // national form
		{"(136) 0000.0009", "CN", "+8613600000009"},
		{"＋８６ １３６ ００００ ０００９", "CN", "+8613600000009"}, // full width, ideographic spaces
		{"+86 136 0000 0009", "", "+8613600000009"},
		{"(415) 555-2671", "US", "+14155552671"},
		{"(415) 555-2671", "us", "+14155552671"},
		{"011 1 415 555 2671", "US", "+14155552671"}, // the US's international prefix
		{"+1 415 555 2671", "US", "+14155552671"},
		{"+1 415 555 2671", "CN", "+14155552671"}, // a + overrides the region
		{"+1 415 555 2671", "", "+14155552671"},
		{"+44 20 7946 0000", "CN", "+442079460000"},
	} {
		got, err := phonekey.Normalize(tc.raw, tc.region)
		if err != nil || got != tc.want {
			t.Errorf("Normalize(%q, %q) = %q, %v; want %q", tc.raw, tc.region, got, err, tc.want)
		}
		n, err := phonekey.Parse(tc.raw, tc.region)
		if err != nil || n == nil {
			t.Errorf("Parse(%q, %q) = %v, %v", tc.raw, tc.region, n, err)
		}
	}
}

func TestNormalizeRefuses(t *testing.T) {
	for _, tc := range []struct {
		raw, region, why string
	}{
		{"", "CN", "empty"},
		{"abc", "CN", "only digits"},
		{"+999 1", "CN", "country code"},
		{strings.Repeat("1234567890", 4), "CN", "too many digits"},
		{"+86 1", "CN", "too few digits"},
		{"+86 1234", "CN", "too few digits"},
		{"+86 136 0000", "CN", "no number of +86"},
		{"+8613600000009000000", "CN", "too many digits"},
		{"13600000009", "", "no country code"},                           // no default region: + required
		{"0086 13600000009", "US", "too many digits for a number of +1"}, // 00 is not the US's international prefix
		{"tel:+8613600000009", "CN", "only digits"},
		{"+8613600000009\r\n", "CN", "only digits"},
		{"1-800-FLOWERS", "US", "only digits"},
		{strings.Repeat(" ", 60) + "13600000009", "CN", "over 64 bytes"},
	} {
		got, err := phonekey.Normalize(tc.raw, tc.region)
		if !errors.Is(err, phonekey.ErrInvalidNumber) || got != "" {
			t.Errorf("Normalize(%q, %q) = %q, %v; want ErrInvalidNumber", tc.raw, tc.region, got, err)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, tc.why) || !strings.Contains(msg, "write it as +") {
			t.Errorf("Normalize(%q, %q): %q does not say %q and how to write a number", tc.raw, tc.region, msg, tc.why)
		}
		if strings.TrimSpace(tc.raw) != "" && strings.Contains(msg, strings.TrimSpace(tc.raw)) {
			t.Errorf("Normalize(%q, %q): %q quotes the input", tc.raw, tc.region, msg)
		}
	}
}

func TestBadRegion(t *testing.T) {
	for _, region := range []string{"XX", "001", "ZZ", "China"} {
		if _, err := phonekey.Normalize("+8613600000009", region); !errors.Is(err, phonekey.ErrInvalidRegion) || errors.Is(err, phonekey.ErrInvalidNumber) {
			t.Errorf("Normalize in %q: %v, want ErrInvalidRegion", region, err)
		}
		r := jsonRequest(`{"phone":"+8613600000009"}`)
		if _, err := phonekey.JSONField("phone", region, 1<<10)(r); !errors.Is(err, guard.ErrInvalidKeyFunc) {
			t.Errorf("JSONField in %q: %v, want guard.ErrInvalidKeyFunc", region, err)
		}
	}
	if _, err := phonekey.From(nil, "CN")(jsonRequest(`{}`)); !errors.Is(err, guard.ErrInvalidKeyFunc) {
		t.Errorf("From(nil): %v, want guard.ErrInvalidKeyFunc", err)
	}
}

func jsonRequest(body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/send", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	return r
}

func TestJSONField(t *testing.T) {
	phone := phonekey.JSONField("phone", "CN", 1<<10)
	r := jsonRequest(`{"phone":"0086 136-0000-0009","code":"1"}`)
	key, err := phone(r)
	if err != nil || key != "+8613600000009" {
		t.Fatalf("key = %q, %v", key, err)
	}
	// The handler still reads the body the client sent.
	var req struct{ Phone string }
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Phone != "0086 136-0000-0009" {
		t.Fatalf("handler read %+v, %v", req, err)
	}
	// guard.JSONField's errors pass through unchanged.
	if _, err := phone(jsonRequest(`{"mobile":"13600000009"}`)); !errors.Is(err, guard.ErrNoKey) || errors.Is(err, phonekey.ErrInvalidNumber) {
		t.Fatalf("no member: %v, want guard.ErrNoKey", err)
	}
	if _, err := phone(jsonRequest(`{"phone":"1360000000x"}`)); !errors.Is(err, phonekey.ErrInvalidNumber) {
		t.Fatalf("bad number: %v, want ErrInvalidNumber", err)
	}
	// A JSON integer is read as its digits.
	if key, err := phone(jsonRequest(`{"phone":13600000009}`)); err != nil || key != "+8613600000009" {
		t.Fatalf("integer member: %q, %v", key, err)
	}
	form := phonekey.From(guard.FormField("phone", 1<<10), "US")
	fr := httptest.NewRequest(http.MethodPost, "/send", strings.NewReader("phone=%28415%29+555-2671"))
	fr.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if key, err := form(fr); err != nil || key != "+14155552671" {
		t.Fatalf("From(FormField): %q, %v", key, err)
	}
}

// TestMiddleware: two spellings of one number share one key, so the second
// is denied by a one-minute cooldown; a bad number is a 400 that says what
// to fix.
func TestMiddleware(t *testing.T) {
	testutil.Backends(t, func(t *testing.T, b *testutil.Backend) {
		g, err := guard.New(b.Client(t), guard.WithPrefix(b.Prefix), guard.WithRules(funnel.AtMost(1, time.Minute)))
		if err != nil {
			t.Fatal(err)
		}
		sent := 0
		h := g.Middleware(phonekey.JSONField("phone", "CN", 4<<10))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			sent++
			w.WriteHeader(http.StatusAccepted)
		}))
		post := func(body string) *httptest.ResponseRecorder {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, jsonRequest(body))
			return w
		}
		if w := post(`{"phone":"+8613600000009"}`); w.Code != http.StatusAccepted {
			t.Fatalf("first: %d %s", w.Code, w.Body)
		}
		for _, spelling := range []string{"+86 136 0000 0009", "0086-136-0000-0009", "13600000009"} {
			w := post(`{"phone":"` + spelling + `"}`)
			if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
				t.Fatalf("%q within the cooldown: %d %s, want 429 with Retry-After", spelling, w.Code, w.Body)
			}
		}
		if sent != 1 {
			t.Fatalf("handler ran %d times, want 1", sent)
		}
		w := post(`{"phone":"+86 1"}`)
		var body struct{ Error string }
		if err := json.NewDecoder(w.Body).Decode(&body); err != nil || w.Code != http.StatusBadRequest {
			t.Fatalf("bad number: %d %+v %v, want 400", w.Code, body, err)
		}
		if want := "invalid phone number: too few digits; write it as + and the country code, then the number, or as a national number of CN"; body.Error != want {
			t.Fatalf("bad number: %q, want %q", body.Error, want)
		}
		if sent != 1 {
			t.Fatalf("handler ran %d times, want 1", sent)
		}
	})
}

// TestMiddlewareBadNumbers: the 400 for a number that is not one says what
// to fix, without the error chain or the number the client sent.
func TestMiddlewareBadNumbers(t *testing.T) {
	g, err := guard.New(testutil.Mini(t).Client(t), guard.WithRules(funnel.AtMost(1, time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	h := g.Middleware(phonekey.JSONField("phone", "CN", 4<<10))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the handler got %s", r.URL)
	}))
	const how = "; write it as + and the country code, then the number, or as a national number of CN"
	for _, tc := range []struct{ phone, want string }{
		{`"+86 1"`, "invalid phone number: too few digits" + how},
		{`"136 0000"`, "invalid phone number: no number of +86 starts with these digits or has this many" + how},
		{`"1360000000x"`, "invalid phone number: only digits, +, spaces and - . ( ) may appear" + how},
		{`"tel:+8613600000009"`, "invalid phone number: only digits, +, spaces and - . ( ) may appear" + how},
		{`"+999 1360000"`, "invalid phone number: a country code that does not exist" + how},
		{`"+86 1360000000912345"`, "invalid phone number: too many digits for a number of +86" + how},
		{`""`, `empty field "phone"`},
		{`true`, `field "phone" must be a string or a number`},
	} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, jsonRequest(`{"phone":`+tc.phone+`}`))
		var body struct{ Error string }
		if err := json.NewDecoder(w.Body).Decode(&body); err != nil || w.Code != http.StatusBadRequest || body.Error != tc.want {
			t.Errorf("%s: %d %q, %v; want 400 %q", tc.phone, w.Code, body.Error, err, tc.want)
		}
		for _, s := range []string{"guard:", "phonekey:", strings.Trim(tc.phone, `"`)} {
			if s != "" && strings.Contains(body.Error, s) {
				t.Errorf("%s: %q contains %q", tc.phone, body.Error, s)
			}
		}
	}
}
