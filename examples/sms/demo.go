package main

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"time"
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
	var req numberRequest
	if err := decode(r, &req); err != nil {
		badRequest(w, err)
		return
	}
	d, ip := s.states, clientIP(r, s.cfg.TrustProxy)
	resets := []stateReset{
		{"address", d.ip, d.storedKey(ip)}, {"address", d.ipVerify, d.storedKey(ip)},
		{"budget", d.budget, d.storedKey(budgetKey)},
	}
	var number, prefix string
	if dest, err := s.numbers.parse(req.Phone, req.Country, s.cfg.PrefixDigits); err == nil {
		number, prefix = dest.E164, dest.Prefix
		own := s.numberResets(dest.E164)
		resets = append(resets, own[0], stateReset{"prefix", d.prefix, d.storedKey(dest.Prefix)}, own[1])
	}
	done, err := s.resetStates(r.Context(), resets)
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, reply{Error: "service unavailable, try again later", RetryAfter: seconds(time.Second)})
		return
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
