package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"

	"github.com/funnelguard/funnelguard/servercheck"
	"github.com/redis/go-redis/v9"
)

// Health statuses of /healthz (reply.Status).
const (
	healthOK = "ok"
	// healthDegraded: a Redis server may evict the limits' keys.
	healthDegraded = "degraded"
)

// Eviction verdicts of a server (serverReport.Eviction).
const (
	evictionNone     = "none"     // noeviction, or no memory limit
	evictionPossible = "possible" // servercheck.ErrEvictionPolicy
	evictionUnknown  = "unknown"  // servercheck.ErrUnknownPolicy: managed services, miniredis
)

// serverReport is one Redis server of /healthz: what servercheck found. It
// does not name the server: /healthz is served on the public address, and
// where the Redis servers are is nobody's business there; the service logs
// them at start-up (logServerCheck).
type serverReport struct {
	Eviction  string `json:"eviction"`
	Policy    string `json:"maxmemory_policy,omitempty"`
	MaxMemory *int64 `json:"maxmemory,omitempty"` // bytes, 0 for no limit; absent when unknown
	Note      string `json:"note,omitempty"`
}

// healthz answers 503 {"error": "redis unavailable"} when a Redis server
// does not answer in time, and 200 otherwise, with the status and what
// servercheck found of each server: {"status": "ok", "redis": [{"eviction":
// "none", "maxmemory_policy": "noeviction", "maxmemory": 0}]}.
//
// A server whose policy may evict the limits' keys makes the status
// "degraded", still with 200: a load balancer or an orchestrator takes an
// instance that answers 503 out of rotation or restarts it, which changes
// nothing about a Redis setting that all instances share, and would turn a
// risk (limits lost once Redis is full) into an outage of the whole service.
// Monitoring should alert on "degraded". A server that does not say its
// policy (a managed service that hides CONFIG, the embedded miniredis) is
// "unknown" but "ok": nothing is known to be wrong.
func (s *Service) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Timeout)
	defer cancel()
	if err := s.client.Ping(ctx).Err(); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, reply{Error: "redis unavailable"})
		return
	}
	findings, err := servercheck.Check(ctx, s.client)
	if errors.Is(err, servercheck.ErrNoAnswer) {
		// A cluster's master that does not answer: the keys it holds are
		// unavailable as when PING fails.
		writeJSON(w, http.StatusServiceUnavailable, reply{Error: "redis unavailable"})
		return
	}
	rep := reply{Status: healthOK, Redis: make([]serverReport, 0, len(findings))}
	if errors.Is(err, servercheck.ErrEvictionPolicy) {
		rep.Status = healthDegraded
	}
	for _, f := range findings {
		sr := serverReport{Eviction: evictionNone, Policy: f.Policy, Note: f.Note}
		switch {
		case errors.Is(f.Err, servercheck.ErrEvictionPolicy):
			sr.Eviction = evictionPossible
		case f.Err != nil:
			sr.Eviction = evictionUnknown
		}
		if f.MaxMemory >= 0 {
			sr.MaxMemory = &f.MaxMemory
		}
		rep.Redis = append(rep.Redis, sr)
	}
	writeJSON(w, http.StatusOK, rep)
}

// logServerCheck runs servercheck on client at start-up and logs what it
// found of each server, with its address: a warning for a server that may
// evict the limits' keys (the service runs all the same, and /healthz says
// "degraded"), or that did not answer or say.
func logServerCheck(ctx context.Context, client redis.UniversalClient, log *slog.Logger) {
	findings, err := servercheck.Check(ctx, client)
	if len(findings) == 0 && err != nil {
		log.Warn("redis eviction check failed", "err", err)
	}
	for _, f := range findings {
		attrs := []any{"addr", f.Addr, "maxmemory_policy", f.Policy, "maxmemory", f.MaxMemory}
		switch {
		case errors.Is(f.Err, servercheck.ErrEvictionPolicy):
			log.Warn("redis may evict rate-limit keys when full, turning limits off: set maxmemory-policy noeviction", append(attrs, "err", f.Err)...)
		case f.Err != nil:
			log.Warn("redis eviction policy not checked", append(attrs, "err", f.Err)...)
		case f.Note != "":
			log.Warn("redis evicts nothing now, having no memory limit, but would once maxmemory is set: set maxmemory-policy noeviction", append(attrs, "note", f.Note)...)
		default:
			log.Info("redis does not evict rate-limit keys", attrs...)
		}
	}
}
