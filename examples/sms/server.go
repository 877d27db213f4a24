package main

import (
	"embed"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/mutex"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
)

//go:embed web
var webFS embed.FS

// Service is the verification-code service: send and verify endpoints, a
// page, health and metrics.
type Service struct {
	cfg      Config
	client   redis.UniversalClient
	numbers  *numberPolicy
	phone    *guard.Guard    // per number: cooldown, hourly, daily
	ip       *guard.Guard    // sends per client IP
	prefix   *guard.Guard    // sends per destination prefix (pumping)
	budget   *guard.Guard    // sends of the whole service (the cost cap)
	ipVerify *guard.Guard    // verifications per client IP
	failures *funnel.Limiter // failed verifications per number
	codes    *codeStore
	provider Provider
	// providerCalls bounds the provider's calls in flight across the fleet
	// (Config.ProviderInFlight); nil: no bound.
	providerCalls *mutex.Semaphore
	outbox        func() []outboxMessage // the demo outbox; nil when not served
	demo          bool                   // the demo's reset of its limits is routed (a demo, with the outbox)
	states        *guardStates           // the guards' state, for the demo's reset and the operators' tools
	log           *slog.Logger
	metrics       *metrics

	conversion *conversionGuard // pauses the prefixes whose codes are not verified; nil when off
	pools      *pools           // pooled conversion and velocity; nil when off
	money      *spendGuards     // the money guards; nil when off
	prices     *priceTable
}

// budgetKey is the one key of the budget guard.
const budgetKey = "all"

// errNoOutbox reports Config.DemoOutbox with a provider that keeps none.
var errNoOutbox = errors.New("the demo outbox needs the console provider")

// NewService builds the service on client.
func NewService(client redis.UniversalClient, cfg Config, provider Provider, log *slog.Logger) (*Service, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	numbers, err := newNumberPolicy(cfg.Region, cfg.Countries)
	if err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, client: client, numbers: numbers, provider: provider, log: log, metrics: newMetrics(),
		codes: &codeStore{client: client, secret: cfg.Secret, ttl: cfg.CodeTTL, maxAttempts: cfg.MaxAttempts}}
	if cfg.DemoOutbox {
		p, ok := provider.(interface{ Outbox() []outboxMessage })
		if !ok {
			return nil, errNoOutbox
		}
		s.outbox, s.demo = p.Outbox, true
	}
	if s.states, err = newGuardStates(client, cfg.Secret); err != nil {
		return nil, err
	}
	// Numbers, prefixes and addresses are stored as HMACs (guard.WithSecret).
	// The guards a send to a number goes through all cost the same for a
	// number never seen as for one that was sent codes (WithUniformCost): the
	// answers' timing must not tell them apart. (The budget's key is one for
	// all numbers, but whether it has state depends on the traffic: uniform
	// too, so that its cost does not vary with the moment either.)
	for _, g := range []struct {
		to      **guard.Guard
		name    string
		prefix  string
		rules   []funnel.Rule
		uniform bool
	}{
		{&s.phone, "phone", "sms:phone:", cfg.phoneRules(), true},
		{&s.ip, "ip", "sms:ip:", cfg.ipRules(), false},
		{&s.prefix, "prefix", "sms:prefix:", cfg.prefixRules(), true},
		{&s.budget, "budget", "sms:budget:", []funnel.Rule{cfg.budgetRule()}, true},
		{&s.ipVerify, "ip-verify", "sms:vip:", cfg.ipVerifyRules(), false},
	} {
		var opts []funnel.Option
		if g.uniform {
			opts = append(opts, funnel.WithUniformCost())
		}
		*g.to, err = guard.New(client,
			guard.WithPrefix(g.prefix),
			guard.WithRules(g.rules...),
			guard.WithFunnel(opts...),
			guard.WithSecret(cfg.Secret),
			guard.WithTimeout(cfg.Timeout),
			guard.WithObserve(s.metrics.observe(g.name)),
		)
		if err != nil {
			return nil, err
		}
	}
	if s.failures, err = funnel.New(client, funnel.WithPrefix("sms:fail:")); err != nil {
		return nil, err
	}
	if s.providerCalls, err = newProviderCalls(client, cfg.ProviderInFlight); err != nil {
		return nil, err
	}
	s.conversion = newConversionGuard(s)
	s.pools = newPools(s)
	if s.prices, err = loadPrices(cfg.Spend.PricesFile); err != nil {
		return nil, err
	}
	if s.money, err = newSpendGuards(s); err != nil {
		return nil, err
	}
	if t, ok := provider.(*Twilio); ok {
		t.onPrice = s.learnPrice
	}
	return s, nil
}

// Handler returns the service's routes, /metrics included.
func (s *Service) Handler() http.Handler { return s.handler(true) }

// APIHandler returns the service's routes without /metrics, for a service
// whose metrics are served on an address of their own (MetricsHandler).
func (s *Service) APIHandler() http.Handler { return s.handler(false) }

// MetricsHandler serves the service's Prometheus metrics.
func (s *Service) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{})
}

func (s *Service) handler(withMetrics bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/sms/send", s.send)
	mux.HandleFunc("POST /api/sms/verify", s.verify)
	mux.HandleFunc("GET /api/sms/settings", s.settings)
	mux.HandleFunc("POST "+reportPath, s.deliveryReport)
	if s.outbox != nil {
		mux.HandleFunc("GET /api/sms/outbox", s.showOutbox)
		mux.HandleFunc("POST /api/demo/reset", s.resetDemo)
	}
	mux.HandleFunc("GET /healthz", s.healthz)
	if withMetrics {
		mux.Handle("GET /metrics", s.MetricsHandler())
	}
	servePage(mux)
	return secured(jsonErrors(mux))
}

// reply is the JSON body of every answer of the API but the page's
// settings and the outbox.
type reply struct {
	Error string `json:"error,omitempty"`
	// Reason is, for a number the policy refused (422), why: landline,
	// toll_free, premium_rate, satellite, country, provider_refused...
	Reason string `json:"reason,omitempty"`
	// Number and Country are the number as read, in E.164, and its region,
	// for a code sent (202) or a number refused (422): 4155552673 read in
	// the default region CN is +864155552673.
	Number  string `json:"number,omitempty"`
	Country string `json:"country,omitempty"`
	// Scope and Rule name the limit of a 429: scope number, ip, prefix or
	// budget, and the rule's name (cooldown, hourly, ip-daily, budget...).
	Scope      string `json:"scope,omitempty"`
	Rule       string `json:"rule,omitempty"`
	RetryAfter *int64 `json:"retry_after,omitempty"`
	Verified   bool   `json:"verified,omitempty"`
	// AttemptsLeft is, on the 401 of the wrong guess that spent a code
	// (its last attempt), 0: request a new code. Absent on every other
	// answer.
	AttemptsLeft *int64 `json:"attempts_left,omitempty"`
	// Status and Redis are the health check's (200): "ok" or "degraded",
	// and what it found of each Redis server (see healthz).
	Status string         `json:"status,omitempty"`
	Redis  []serverReport `json:"redis,omitempty"`
}

func seconds(d time.Duration) *int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return &s
}

func writeJSON(w http.ResponseWriter, status int, r reply) {
	if r.RetryAfter != nil && status != http.StatusAccepted {
		w.Header().Set("Retry-After", strconv.FormatInt(max(*r.RetryAfter, 1), 10))
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(r)
}
