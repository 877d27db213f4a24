package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/nyaruka/phonenumbers"
)

// everyCountry allows numbers of every region: what is left to refuse them
// is their type.
func everyCountry(c *Config) { c.Countries = []string{"*"} }

// The numbers of the issue: each was a paid SMS; each is now a 422 naming
// why, and nothing is sent or counted.
func TestRefusedNumbers(t *testing.T) {
	for _, tc := range []struct {
		phone, country string
		reason, number string
	}{
		{"+861065529988", "", "landline", "+861065529988"},     // Beijing landline
		{"+18005550199", "", "toll_free", "+18005550199"},      // US toll-free
		{"+19005550123", "", "premium_rate", "+19005550123"},   // US premium-rate
		{"+881600000000", "", "satellite", "+881600000000"},    // Iridium
		{"+864008108888", "", "shared_cost", "+864008108888"},  // a Chinese 400 service number
		{"4155552673", "", "landline", "+864155552673"},        // a US number without +1, read in CN: said, not sent
		{"020 7946 0018", "GB", "landline", "+442079460018"},   // London, national form
		{"+14155552673", "", "country", "+14155552673"},        // a US mobile, US not allowed
		{"415 555 2673", "US", "country", "+14155552673"},      // the same, its country given
		{"+61 412 345 678", "", "country", "+61412345678"},     // an Australian mobile
		{"+870 773 111 632", "", "satellite", "+870773111632"}, // Inmarsat
	} {
		t.Run(tc.phone, func(t *testing.T) {
			e := newEnv(t) // countries CN and GB
			r := e.do("POST", "/api/sms/send", map[string]string{"phone": tc.phone, "country": tc.country})
			e.want(r, http.StatusUnprocessableEntity, "send to "+tc.phone)
			if r.body.Reason != tc.reason || r.body.Number != tc.number || r.body.Error == "" {
				t.Fatalf("send to %s = %v; want reason %s for %s", tc.phone, r, tc.reason, tc.number)
			}
			// A national number refused in the default region says how it
			// was read.
			if hint := strings.Contains(r.body.Error, "without +"); hint != (tc.phone == "4155552673") {
				t.Fatalf("send to %s = %v; the reading hint %v", tc.phone, r, hint)
			}
			if n := len(e.sms.messages()); n != 0 {
				t.Fatalf("%d messages sent", n)
			}
			if _, n := e.strayKeys(); n != 0 {
				t.Fatalf("%d keys written for a refused number", n)
			}
		})
	}
}

// Every number type but mobile and fixed-line-or-mobile is refused, in every
// region that has an example of it (phonenumbers' own example numbers), with
// every country allowed; and the two types that can receive SMS are sent.
func TestNumberTypes(t *testing.T) {
	e := newEnv(t, everyCountry, noIPLimits)
	tried := map[phonenumbers.PhoneNumberType]int{}
	next := 0
	for region := range phonenumbers.GetSupportedRegions() {
		for typ := phonenumbers.FIXED_LINE; typ <= phonenumbers.VOICEMAIL; typ++ {
			ex := phonenumbers.GetExampleNumberForType(region, typ)
			if ex == nil {
				continue
			}
			e164 := phonenumbers.Format(ex, phonenumbers.E164)
			if !phonenumbers.IsValidNumber(ex) || phonenumbers.GetNumberType(ex) != typ || phonenumbers.GetRegionCodeForNumber(ex) != region {
				continue // an example shared with another region or type
			}
			tried[typ]++
			next++
			r := e.do("POST", "/api/sms/send", map[string]string{"phone": e164}, "X-Forwarded-For", fmt.Sprint(next))
			switch typ {
			case phonenumbers.MOBILE, phonenumbers.FIXED_LINE_OR_MOBILE:
				e.want(r, http.StatusAccepted, fmt.Sprintf("send to %s (%s, type %d)", e164, region, typ))
			default:
				e.want(r, http.StatusUnprocessableEntity, fmt.Sprintf("send to %s (%s, type %d)", e164, region, typ))
				if want := typeReasons[typ][0]; r.body.Reason != want || r.body.Country != region {
					t.Fatalf("send to %s (%s, type %d) = %v; want reason %s, country %s", e164, region, typ, r, want, region)
				}
			}
		}
	}
	t.Logf("example numbers tried, by type: %v", tried)
	for typ := phonenumbers.FIXED_LINE; typ <= phonenumbers.VOICEMAIL; typ++ {
		if tried[typ] == 0 {
			t.Errorf("no example number of type %d", typ)
		}
	}
	refused := 0
	for typ, n := range tried {
		if typ != phonenumbers.MOBILE && typ != phonenumbers.FIXED_LINE_OR_MOBILE {
			refused += n
		}
	}
	if got := len(e.sms.messages()); got != tried[phonenumbers.MOBILE]+tried[phonenumbers.FIXED_LINE_OR_MOBILE] {
		t.Fatalf("%d messages; want one per mobile example, %d (and none of the %d refused)", got,
			tried[phonenumbers.MOBILE]+tried[phonenumbers.FIXED_LINE_OR_MOBILE], refused)
	}
}

// A national number is read in the country the request names, else in the
// default region; a number with + is read as written, whatever the country.
func TestCountryOfANationalNumber(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Countries = []string{"CN", "US", "GB"} }, noIPLimits)
	for i, tc := range []struct{ phone, country, want string }{
		{"415 555 2673", "US", "+14155552673"},
		{"415 555 2673", "us", "+14155552673"},
		{"13800138000", "", "+8613800138000"},
		{"07400 123456", "GB", "+447400123456"},
		{"+86 139 0000 0001", "US", "+8613900000001"},
	} {
		e.at(time.Duration(i) * time.Hour) // past the cooldown of the number sent before
		r := e.do("POST", "/api/sms/send", map[string]string{"phone": tc.phone, "country": tc.country})
		e.want(r, http.StatusAccepted, fmt.Sprintf("send to %q in %q", tc.phone, tc.country))
		if r.body.Number != tc.want {
			t.Fatalf("send to %q in %q = %v; want it sent to %s", tc.phone, tc.country, r, tc.want)
		}
		if ms := e.sms.messages(); ms[i].to != tc.want {
			t.Fatalf("message %d to %s; want %s", i, ms[i].to, tc.want)
		}
	}
	for _, country := range []string{"XX", "001", "U", "USA", "{}", "🇺🇸"} {
		r := e.do("POST", "/api/sms/send", map[string]string{"phone": "415 555 2673", "country": country})
		e.want(r, http.StatusBadRequest, fmt.Sprintf("country %q", country))
	}
}

// The allow-list: the default region alone by default, * for all, a list.
func TestCountryAllowList(t *testing.T) {
	for _, tc := range []struct {
		countries []string
		sent      map[string]bool
	}{
		{nil, map[string]bool{"+8613800138000": true}},
		{[]string{"*"}, map[string]bool{"+8613800138000": true, "+14155552673": true, "+447400123456": true, "+61412345678": true}},
		{[]string{"US", "au"}, map[string]bool{"+14155552673": true, "+61412345678": true}},
	} {
		t.Run(fmt.Sprint(tc.countries), func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.Countries = tc.countries })
			for _, phone := range []string{"+8613800138000", "+14155552673", "+447400123456", "+61412345678"} {
				r := e.send(phone)
				switch {
				case tc.sent[phone]:
					e.want(r, http.StatusAccepted, "send to "+phone)
				default:
					e.want(r, http.StatusUnprocessableEntity, "send to "+phone)
					if r.body.Reason != "country" {
						t.Fatalf("send to %s = %v; want reason country", phone, r)
					}
				}
			}
			settings := e.settings()
			if len(tc.countries) == 0 && (len(settings.Countries) != 1 || settings.Countries[0].Region != "CN" || settings.Countries[0].Code != 86) {
				t.Fatalf("settings = %+v; want CN (+86) alone", settings)
			}
			if tc.countries != nil && tc.countries[0] == "*" && len(settings.Countries) < 200 {
				t.Fatalf("settings list %d countries; want every region", len(settings.Countries))
			}
		})
	}
	for _, bad := range [][]string{{"XX"}, {"*", "US"}, {""}, {"001"}} {
		cfg := testConfig()
		cfg.Countries = bad
		if _, err := NewService(testutil.Mini(t).Client(t), cfg, &capture{}, nil); !errors.Is(err, errConfig) {
			t.Errorf("countries %q: %v; want errConfig", bad, err)
		}
	}
}

// getJSON GETs path and decodes its JSON body into v, strictly.
func (e *env) getJSON(path string, v any) {
	e.t.Helper()
	res, err := e.srv.Client().Get(e.srv.URL + path)
	if err != nil {
		e.t.Fatalf("GET %s: %v", path, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "application/json" {
		e.t.Fatalf("GET %s: %s, Content-Type %q", path, res.Status, res.Header.Get("Content-Type"))
	}
	dec := json.NewDecoder(res.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		e.t.Fatalf("GET %s: %v", path, err)
	}
}

// settings returns what the page is told.
func (e *env) settings() settings {
	e.t.Helper()
	var s settings
	e.getJSON("/api/sms/settings", &s)
	return s
}
