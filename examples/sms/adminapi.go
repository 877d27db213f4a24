package main

import (
	"context"
	"net/http"
	"regexp"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
)

// numberState is a number's state, as GET /api/number answers it: each
// guard that limits sends to it, its lockout, whether a code is
// outstanding (never the code, nor its hash), and whether its prefix is
// paused by the conversion guard.
type numberState struct {
	Number  string `json:"number"`
	Country string `json:"country"`
	Prefix  string `json:"prefix"`
	// Guards are the number's sends (scope number), its destination
	// prefix's (prefix) and its failed verifications (verify-failures).
	Guards    []guardState `json:"guards"`
	LockedOut bool         `json:"locked_out"`
	// CodeOutstanding: a code was sent and is neither used, spent nor
	// expired; CodeExpiresIn is when it expires, in seconds.
	CodeOutstanding bool  `json:"code_outstanding"`
	CodeExpiresIn   int64 `json:"code_expires_in,omitempty"`
	// PrefixPaused: the conversion guard pauses the prefix for
	// PrefixPauseLeft seconds yet.
	PrefixPaused    bool  `json:"prefix_paused"`
	PrefixPauseLeft int64 `json:"prefix_pause_left,omitempty"`
}

// guardState is a guard's figures for one key, as its next call would
// find them (funnel's Peek): whether it would be admitted, the units left
// by the tightest rule, and when a call would be admitted (seconds; 0
// now); Rules are each rule's.
type guardState struct {
	Scope      string      `json:"scope"`
	Allowed    bool        `json:"allowed"`
	Remaining  int64       `json:"remaining"`
	Tightest   string      `json:"tightest"`
	RetryAfter int64       `json:"retry_after"`
	Rules      []ruleState `json:"rules"`
}

// ruleState is one rule's figures.
type ruleState struct {
	Rule       string `json:"rule"`
	Remaining  int64  `json:"remaining"`
	RetryAfter int64  `json:"retry_after"`
}

// unavailable answers a Redis failure.
func (s *Service) unavailable(w http.ResponseWriter) {
	s.metrics.redisErrors.Inc()
	writeJSON(w, http.StatusServiceUnavailable, reply{Error: "service unavailable, try again later", RetryAfter: seconds(time.Second)})
}

// adminNumber answers GET /api/number?phone=...&country=...: the number's
// state. The number is read as send reads it.
func (s *Service) adminNumber(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	dest, err := s.numbers.parse(q.Get("phone"), q.Get("country"), s.cfg.PrefixDigits)
	if err != nil {
		s.refused(w, err)
		return
	}
	st, err := s.numberState(r.Context(), dest)
	if err != nil {
		s.unavailable(w)
		return
	}
	s.log.Info("admin: number state read", "to", maskPhone(dest.E164))
	writeAny(w, http.StatusOK, st)
}

// numberState reads dest's state: Peek of each guard, under the keys the
// guards use, the code's hash (whether it holds a code) and the pause.
func (s *Service) numberState(ctx context.Context, dest destination) (numberState, error) {
	st := numberState{Number: dest.E164, Country: dest.Region, Prefix: shownPrefix(dest)}
	for _, g := range []struct {
		scope string
		lim   *funnel.Limiter
		key   string
		rules []funnel.Rule
	}{
		{"number", s.states.phone, s.states.storedKey(dest.E164), s.cfg.phoneRules()},
		{"prefix", s.states.prefix, s.states.storedKey(dest.Prefix), s.cfg.prefixRules()},
		{"verify-failures", s.failures, s.codes.key(dest.E164), []funnel.Rule{s.cfg.failureRule()}},
	} {
		gs, err := s.peekGuard(ctx, g.lim, g.key, g.rules)
		if err != nil {
			return st, err
		}
		gs.Scope = g.scope
		st.Guards = append(st.Guards, gs)
	}
	st.LockedOut = !st.Guards[2].Allowed
	err := s.bounded(ctx, func(ctx context.Context) error {
		left, err := s.codes.outstanding(ctx, dest.E164)
		st.CodeOutstanding, st.CodeExpiresIn = left > 0, *seconds(left)
		return err
	})
	if err != nil || s.conversion == nil {
		return st, err
	}
	left, err := s.conversion.pauseLeft(ctx, dest.Prefix)
	st.PrefixPaused, st.PrefixPauseLeft = left > 0, *seconds(left)
	return st, err
}

// peekGuard returns what the guard's rules, and each of them, would decide
// for key now, changing nothing.
func (s *Service) peekGuard(ctx context.Context, lim *funnel.Limiter, key string, rules []funnel.Rule) (guardState, error) {
	var gs guardState
	for i := -1; i < len(rules); i++ {
		some := rules
		if i >= 0 {
			some = rules[i : i+1]
		}
		var res funnel.Result
		if err := s.bounded(ctx, func(ctx context.Context) (err error) {
			res, err = lim.Peek(ctx, key, some...)
			return err
		}); err != nil {
			return gs, err
		}
		if i < 0 {
			gs = guardState{Allowed: res.Allowed, Remaining: res.Remaining, Tightest: res.Tightest, RetryAfter: *seconds(res.RetryAfter)}
			continue
		}
		gs.Rules = append(gs.Rules, ruleState{Rule: rules[i].Name, Remaining: res.Remaining, RetryAfter: *seconds(res.RetryAfter)})
	}
	return gs, nil
}

// adminReset answers POST /api/number/reset {"phone": "...", "country":
// "..."}: the number's sends (cooldown, hourly, daily) and its lockout
// start afresh. Its outstanding code, if any, stays as it is.
func (s *Service) adminReset(w http.ResponseWriter, r *http.Request) {
	var req numberRequest
	if err := decode(r, &req, "phone"); err != nil {
		badRequest(w, err)
		return
	}
	dest, err := s.numbers.parse(req.Phone, req.Country, s.cfg.PrefixDigits)
	if err != nil {
		s.refused(w, err)
		return
	}
	done, err := s.resetStates(r.Context(), s.numberResets(dest.E164))
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, reply{Error: "service unavailable, try again later", RetryAfter: seconds(time.Second)})
		return
	}
	s.log.Info("admin: number reset", "limits", "number,verify-failures", "to", maskPhone(dest.E164))
	writeAny(w, http.StatusOK, demoResetReply{Reset: done, Number: dest.E164})
}

// adminPrefixes answers GET /api/prefixes: the prefixes the conversion
// guard pauses, with the figures each was paused for.
func (s *Service) adminPrefixes(w http.ResponseWriter, r *http.Request) {
	out := struct {
		Conversion bool           `json:"conversion"` // whether the guard is on
		Paused     []pausedPrefix `json:"paused"`
	}{Conversion: s.conversion != nil, Paused: []pausedPrefix{}}
	if s.conversion != nil {
		var err error
		if out.Paused, err = s.conversion.paused(r.Context()); err != nil {
			s.unavailable(w)
			return
		}
	}
	s.log.Info("admin: paused prefixes read", "paused", len(out.Paused))
	writeAny(w, http.StatusOK, out)
}

var (
	prefixPattern = regexp.MustCompile(`^\+[0-9]{2,16}$`)
	idPattern     = regexp.MustCompile(`^[A-Za-z0-9_-]{43}$`) // an HMAC-SHA256, base64url
)

// adminResume answers POST /api/prefixes/resume {"prefix": "+8613800"} or
// {"id": "..."} (as GET /api/prefixes lists it): the pause ends, and the
// prefix's sends are judged afresh.
func (s *Service) adminResume(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Prefix string `json:"prefix"`
		ID     string `json:"id"`
	}
	if err := decode(r, &req); err != nil {
		badRequest(w, err)
		return
	}
	if s.conversion == nil {
		writeJSON(w, http.StatusNotFound, reply{Error: "the conversion guard is off"})
		return
	}
	id := req.ID
	if prefixPattern.MatchString(req.Prefix) && id == "" {
		id = s.conversion.id(req.Prefix)
	}
	if !idPattern.MatchString(id) {
		writeJSON(w, http.StatusBadRequest, reply{Error: `give "prefix" (such as +8613800) or "id" (as listed)`})
		return
	}
	resumed, err := s.conversion.resumeID(r.Context(), id)
	if err != nil {
		s.unavailable(w)
		return
	}
	s.log.Info("admin: prefix resumed", "id", id, "was_paused", resumed)
	writeAny(w, http.StatusOK, struct {
		Resumed bool `json:"resumed"`
	}{resumed})
}

// budgetState is the day's budget, as GET /api/budget answers it.
type budgetState struct {
	Limit int64  `json:"limit"`
	Used  int64  `json:"used"`
	Left  int64  `json:"left"`
	Zone  string `json:"zone"`
	Day   string `json:"day"` // the budget's day, in its zone: 2026-11-26
	// ResetsAt is the day's end, the next midnight in Zone; ResetsIn is
	// how long until then, in seconds.
	ResetsAt time.Time `json:"resets_at"`
	ResetsIn int64     `json:"resets_in"`
}

// adminBudget answers GET /api/budget: the sends of the calendar day and
// those left of -daily-budget (the budget guard's Peek: Remaining is what
// is left), and when the day ends, by Redis's clock.
func (s *Service) adminBudget(w http.ResponseWriter, r *http.Request) {
	rule := s.cfg.budgetRule()
	var res funnel.Result
	var now time.Time
	err := s.bounded(r.Context(), func(ctx context.Context) (err error) {
		if res, err = s.states.budget.Peek(ctx, s.states.storedKey(budgetKey), rule); err != nil {
			return err
		}
		now, err = s.client.Time(ctx).Result()
		return err
	})
	if err != nil {
		s.unavailable(w)
		return
	}
	zone := s.cfg.BudgetZone
	if zone == nil {
		zone = time.UTC
	}
	local := now.In(zone)
	end := time.Date(local.Year(), local.Month(), local.Day()+1, 0, 0, 0, 0, zone)
	s.log.Info("admin: budget read")
	writeAny(w, http.StatusOK, budgetState{Limit: s.cfg.DailyBudget, Used: s.cfg.DailyBudget - res.Remaining, Left: res.Remaining,
		Zone: zone.String(), Day: local.Format(time.DateOnly), ResetsAt: end, ResetsIn: *seconds(end.Sub(now))})
}
