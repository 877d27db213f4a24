package main

import (
	"net/http"
	"strings"
	"testing"
)

// The wrong guess that spends a code (its last attempt) says so: 401 with
// attempts_left 0. The guesses before it, and those after it, get the one
// answer of a number with no code.
func TestVerifyLastAttempt(t *testing.T) {
	e := newEnv(t, noIPLimits)
	noCode := e.verify(phoneN(1), "000000")
	e.want(noCode, http.StatusUnauthorized, "verify of a number without a code")
	e.want(e.send(number), http.StatusAccepted, "send")
	code := e.sms.code(t, number)
	for i := range e.cfg.MaxAttempts {
		r := e.verify(number, wrong(code, int(i)))
		e.want(r, http.StatusUnauthorized, "wrong code")
		if i < e.cfg.MaxAttempts-1 {
			if r.raw != noCode.raw {
				t.Errorf("wrong guess %d = %v; want %v, as for a number with no code", i+1, r, noCode)
			}
			continue
		}
		const last = `{"error":"wrong code, and that was the last attempt: request a new code","attempts_left":0}`
		if strings.TrimSpace(r.raw) != last || r.body.AttemptsLeft == nil || *r.body.AttemptsLeft != 0 {
			t.Errorf("the last wrong guess = %v; want 401 %s", r, last)
		}
	}
	for _, c := range []string{wrong(code, 99), code} {
		if r := e.verify(number, c); r.raw != noCode.raw {
			t.Errorf("guess after the code was spent = %v; want %v", r, noCode)
		}
	}
}
