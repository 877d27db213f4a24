package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/redis/go-redis/v9"
)

// demoRegions are the countries a local demo offers when -countries is not
// given: a handful, so that a visitor can try numbers of more than one
// country, and the rules by country, without allowing the whole world.
var demoRegions = []string{"US", "GB", "DE", "FR", "IN", "CN"}

// demoCountries returns demoRegions and region, for a demo whose default
// region is not among them.
func demoCountries(region string) []string {
	out := slices.Clone(demoRegions)
	if r := strings.ToUpper(region); !slices.Contains(out, r) {
		out = append(out, r)
	}
	return out
}

// demoReset lifts a local demo's limits (POST /api/demo/reset): the guards'
// funnels are reset under the keys the guards keep them by. A guard has no
// reset of its own; a Limiter on the guard's prefix reaches the same state,
// under the same locks, given the key as the guard stores it (storedKey).
type demoReset struct {
	secret []byte
	// By guard, as NewService names them: the Limiter on its prefix.
	ip, ipVerify, phone, prefix, budget *funnel.Limiter
}

// newDemoReset returns the reset of the guards NewService builds with these
// prefixes and secret.
func newDemoReset(client redis.UniversalClient, secret []byte) (*demoReset, error) {
	d := &demoReset{secret: secret}
	for _, l := range []struct {
		to     **funnel.Limiter
		prefix string
	}{
		{&d.ip, "sms:ip:"}, {&d.ipVerify, "sms:vip:"}, {&d.phone, "sms:phone:"},
		{&d.prefix, "sms:prefix:"}, {&d.budget, "sms:budget:"},
	} {
		var err error
		if *l.to, err = funnel.New(client, funnel.WithPrefix(l.prefix)); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// storedKey is the key a guard with Policy.Secret keeps key's state under
// (guard.Guard's storedKey: "m:" and the key's HMAC-SHA256).
func (d *demoReset) storedKey(key string) string {
	m := hmac.New(sha256.New, d.secret)
	m.Write([]byte(key))
	return "m:" + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// demoResetReply says what a reset lifted: the limits of the caller's
// address and the service's budget always, and those of the number in the
// form when it is one the service texts.
type demoResetReply struct {
	Reset  []string `json:"reset"`
	Number string   `json:"number,omitempty"`
}

// resetDemo answers POST /api/demo/reset {"phone": "...", "country": "..."},
// routed only in a local demo (the console provider on loopback, as the
// outbox) and answered only to a client on this machine. It resets the
// sends and verifications of the caller's address, the budget, and, for a
// number given, its sends, its destination prefix and its lockout.
func (s *Service) resetDemo(w http.ResponseWriter, r *http.Request) {
	if !localClient(r) {
		writeJSON(w, http.StatusNotFound, reply{Error: "not found"})
		return
	}
	var req struct {
		Phone   string `json:"phone"`
		Country string `json:"country"`
	}
	if err := decode(r, &req); err != nil {
		badRequest(w, err)
		return
	}
	d, ip := s.demo, clientIP(r, s.cfg.TrustProxy)
	resets := []struct {
		name string
		lim  *funnel.Limiter
		key  string
	}{
		{"address", d.ip, d.storedKey(ip)}, {"address", d.ipVerify, d.storedKey(ip)},
		{"budget", d.budget, d.storedKey(budgetKey)},
	}
	var number, prefix string
	if dest, err := s.numbers.parse(req.Phone, req.Country, s.cfg.PrefixDigits); err == nil {
		number, prefix = dest.E164, dest.Prefix
		resets = append(resets, []struct {
			name string
			lim  *funnel.Limiter
			key  string
		}{
			{"number", d.phone, d.storedKey(dest.E164)}, {"prefix", d.prefix, d.storedKey(dest.Prefix)},
			{"verify-failures", s.failures, s.codes.key(dest.E164)},
		}...)
	}
	var done []string
	for _, x := range resets {
		if err := s.bounded(r.Context(), func(ctx context.Context) error { return x.lim.Reset(ctx, x.key) }); err != nil {
			s.metrics.redisErrors.Inc()
			writeJSON(w, http.StatusServiceUnavailable, reply{Error: "service unavailable, try again later", RetryAfter: seconds(time.Second)})
			return
		}
		if !slices.Contains(done, x.name) {
			done = append(done, x.name)
		}
	}
	if prefix != "" && s.conversion != nil {
		// The conversion guard's pause of the number's prefix, if any.
		if err := s.bounded(r.Context(), func(ctx context.Context) error {
			_, err := s.conversion.resume(ctx, prefix)
			return err
		}); err != nil {
			s.metrics.redisErrors.Inc()
			writeJSON(w, http.StatusServiceUnavailable, reply{Error: "service unavailable, try again later", RetryAfter: seconds(time.Second)})
			return
		}
		done = append(done, "conversion")
	}
	s.log.Info("demo limits reset", "limits", strings.Join(done, ","), "to", maskPhone(number))
	writeAny(w, http.StatusOK, demoResetReply{Reset: done, Number: number})
}

// localClient reports whether r comes from this machine, straight: not
// forwarded by a proxy, which would serve the demo's tools to whoever it
// serves.
func localClient(r *http.Request) bool {
	return r.Header.Get("X-Forwarded-For") == "" && r.Header.Get("Forwarded") == "" && parseHost(r.RemoteAddr).IsLoopback()
}
