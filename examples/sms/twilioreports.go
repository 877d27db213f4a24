package main

import (
	"crypto/hmac"
	"crypto/sha1"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
)

// errBadReport reports a request to the delivery reports' address that is
// not a delivery report of the provider's: unsigned, wrongly signed, or
// without a message.
var errBadReport = errors.New("not a genuine delivery report")

// twilioMaxReport is the largest status callback body Report reads; Twilio's
// are a few hundred bytes.
const twilioMaxReport = 16 << 10

// Reports reports whether Twilio is asked to post delivery reports
// (TwilioConfig.StatusCallback).
func (t *Twilio) Reports() bool { return t.callback != "" }

// Report reads a status callback of Twilio's, posted to the
// StatusCallback URL: it returns the message's sid, and whether its
// MessageStatus is failed or undelivered; an error matching errBadReport
// when its X-Twilio-Signature is missing or is not Twilio's signature of
// the StatusCallback URL (with r's query, if any) and r's POST parameters,
// with the auth token, or when it names no message. A genuine report's
// Price, when it has one, goes to onPrice.
func (t *Twilio) Report(r *http.Request) (report, error) {
	r.Body = http.MaxBytesReader(nil, r.Body, twilioMaxReport)
	if err := r.ParseForm(); err != nil {
		return report{}, fmt.Errorf("%w: %w", errBadReport, err)
	}
	signed := t.callback
	if r.URL.RawQuery != "" {
		signed += "?" + r.URL.RawQuery
	}
	got, want := r.Header.Get("X-Twilio-Signature"), twilioSignature(t.secret, signed, r.PostForm)
	if t.callback == "" || got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		return report{}, fmt.Errorf("%w: no valid X-Twilio-Signature", errBadReport)
	}
	sid := r.PostForm.Get("MessageSid")
	if !twilioSID(sid, "SM") && !twilioSID(sid, "MM") {
		return report{}, fmt.Errorf("%w: no message sid", errBadReport)
	}
	st := r.PostForm.Get("MessageStatus")
	// A status callback may carry the message's price (Price, PriceUnit),
	// which the create reply rarely does: Twilio knows it once the carrier
	// has taken the message.
	if p, ok := r.PostForm["Price"]; ok && len(p) == 1 && p[0] != "" {
		t.reportPrice(r.PostForm.Get("To"), &p[0], r.PostForm.Get("PriceUnit"))
	}
	return report{id: sid, to: r.PostForm.Get("To"), undelivered: st == "failed" || st == "undelivered"}, nil
}

// twilioSignature is Twilio's signature of a POST to rawURL with form, as
// its request validation documents it: the base64 of the HMAC-SHA1, keyed
// with the auth token, of the full URL followed by each parameter's name
// and value, sorted by name (a repeated name's values sorted too, as
// Twilio's own libraries do).
func twilioSignature(token, rawURL string, form url.Values) string {
	mac := hmac.New(sha1.New, []byte(token))
	_, _ = io.WriteString(mac, rawURL)
	for _, name := range slices.Sorted(maps.Keys(form)) {
		for _, v := range slices.Sorted(slices.Values(form[name])) {
			_, _ = io.WriteString(mac, name)
			_, _ = io.WriteString(mac, v)
		}
	}
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}
