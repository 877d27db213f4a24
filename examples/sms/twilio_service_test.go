package main

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"
)

// The service on the Twilio provider, against a fake of Twilio's API: a
// destination Twilio refuses is a 422 and a refunded send; Twilio failing
// or not answering is a 502 and a refunded send; an accepted message is a
// 202. A refunded send leaves every guard as it was and no code stored.
func TestServiceOnTwilio(t *testing.T) {
	const sid = "AC0123456789abcdef0123456789abcdef"
	hang := make(chan struct{})
	var answer func(w http.ResponseWriter)
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" || r.URL.Path != "/2010-04-01/Accounts/"+sid+"/Messages.json" || r.FormValue("To") == "" {
			http.Error(w, "unexpected request", http.StatusBadRequest)
			return
		}
		answer(w)
	}))
	t.Cleanup(fake.Close)
	t.Cleanup(func() { close(hang) }) // first: the hung handler returns, then the server closes
	twilioError := func(status, code int, message string) func(w http.ResponseWriter) {
		return func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write([]byte(`{"code": ` + strconv.Itoa(code) + `, "message": "` + message + `", "more_info": "https://www.twilio.com/docs/errors/` +
				strconv.Itoa(code) + `", "status": ` + strconv.Itoa(status) + `}`))
		}
	}
	for _, tc := range []struct {
		name   string
		answer func(w http.ResponseWriter)
		status int
		reason string
	}{
		{"accepted", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"sid": "SM0123456789abcdef0123456789abcdef", "status": "queued"}`))
		}, http.StatusAccepted, ""},
		{"not a mobile (21614)", twilioError(400, 21614, "'To' number is not a valid mobile number"), http.StatusUnprocessableEntity, "provider_refused"},
		{"region not enabled (21408)", twilioError(400, 21408, "Permission to send an SMS has not been enabled for the region indicated by the 'To' number"),
			http.StatusUnprocessableEntity, "provider_refused"},
		{"unsubscribed (21610)", twilioError(400, 21610, "Attempt to send to unsubscribed recipient"), http.StatusUnprocessableEntity, "provider_refused"},
		{"our credentials (20003)", twilioError(401, 20003, "Authenticate"), http.StatusBadGateway, ""},
		{"Twilio's 500", func(w http.ResponseWriter) { http.Error(w, "oops", http.StatusInternalServerError) }, http.StatusBadGateway, ""},
		{"Twilio's rate limit (20429)", twilioError(429, 20429, "Too Many Requests"), http.StatusBadGateway, ""},
		{"no answer", func(w http.ResponseWriter) {
			select {
			case <-hang:
			case <-time.After(time.Minute):
			}
		}, http.StatusBadGateway, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			answer = tc.answer
			// A short time-out only where none is answered: a loaded
			// machine must not turn an answer into a time-out.
			timeout := 10 * time.Second
			if tc.name == "no answer" {
				timeout = 300 * time.Millisecond
			}
			provider, err := NewTwilio(TwilioConfig{BaseURL: fake.URL, AccountSID: sid, AuthToken: "token", From: "+15017122661",
				HTTPClient: &http.Client{Timeout: timeout}})
			if err != nil {
				t.Fatal(err)
			}
			e := newEnv(t)
			e.svc.provider = provider
			before := e.ledger(number, "127.0.0.1")
			r := e.send(number)
			e.want(r, tc.status, "send")
			if r.body.Reason != tc.reason {
				t.Fatalf("send = %v; want reason %q", r, tc.reason)
			}
			if tc.status == http.StatusAccepted {
				return
			}
			e.unchanged("a send the provider did not take", before, e.ledger(number, "127.0.0.1"))
			if n, _ := e.svc.client.Exists(t.Context(), e.svc.codes.key(number)).Result(); n != 0 {
				t.Fatal("the code of a message not sent is still stored")
			}
		})
	}
}
