package main

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"
)

// reportPath is where the service takes delivery reports (Twilio's status
// callbacks): the path of -public-url that the provider posts to.
const reportPath = "/api/sms/delivery-report"

// sentTTL is how long the service remembers a message it sent, to refund
// it when its report says it was not delivered: a day, the budget's
// period. A later report finds nothing and changes nothing.
const sentTTL = 24 * time.Hour

// A reporter is a Provider that names the messages it sends, and whose
// delivery reports the service reads at reportPath (Twilio).
type reporter interface {
	// SendMessage is Send, returning the message's id.
	SendMessage(ctx context.Context, to, text string) (id string, err error)
	// Reports reports whether the provider was asked for reports.
	Reports() bool
	// Report reads a delivery report: the message's id, and whether it
	// was not delivered; an error matching errBadReport when r is not a
	// genuine report.
	Report(r *http.Request) (report, error)
}

// sentKey is the key that remembers a message the service sent, holding its
// destination prefix, until its report comes or sentTTL passes.
func sentKey(id string) string { return "sms:sent:{" + id + "}" }

// deliver hands text for dest to the provider, which has ProviderTimeout to
// take it. When the provider reports deliveries, the message is remembered
// for its report; a failure to remember it costs only its refund, should
// it not be delivered.
func (s *Service) deliver(ctx context.Context, dest destination, text string) error {
	pctx, cancel := context.WithTimeout(ctx, s.cfg.ProviderTimeout)
	defer cancel()
	rep, ok := s.provider.(reporter)
	if !ok || !rep.Reports() {
		return s.provider.Send(pctx, dest.E164, text)
	}
	id, err := rep.SendMessage(pctx, dest.E164, text)
	if err != nil {
		return err
	}
	err = s.bounded(context.WithoutCancel(ctx), func(ctx context.Context) error {
		return s.client.Set(ctx, sentKey(id), dest.Prefix, sentTTL).Err()
	})
	if err != nil {
		s.metrics.redisErrors.Inc()
		s.log.Warn("remembering a message for its delivery report failed: it is not refunded if undelivered", "id", id, "err", err)
	}
	return nil
}

// deliveryReport takes a provider's delivery report: 403 unless it is
// genuine (signed), and then, for a message this service sent that was not
// delivered, the budget's unit back, once however often the report comes.
// Anything else genuine is acknowledged (204) and changes nothing.
func (s *Service) deliveryReport(w http.ResponseWriter, r *http.Request) {
	rep, ok := s.provider.(reporter)
	if !ok || !rep.Reports() {
		writeJSON(w, http.StatusNotFound, reply{Error: "not found"})
		return
	}
	rp, err := rep.Report(r)
	id, undelivered := rp.id, rp.undelivered
	if err != nil {
		s.metrics.reports.WithLabelValues("forbidden").Inc()
		s.log.Warn("delivery report refused", "err", err)
		writeJSON(w, http.StatusForbidden, reply{Error: "forbidden"})
		return
	}
	if !undelivered {
		s.metrics.reports.WithLabelValues("other").Inc()
		w.WriteHeader(http.StatusNoContent)
		return
	}
	// GETDEL: of two copies of one report, only one finds the message.
	var prefix string
	err = s.bounded(r.Context(), func(ctx context.Context) error {
		prefix, err = s.client.GetDel(ctx, sentKey(id)).Result()
		return err
	})
	switch {
	case errors.Is(err, redis.Nil):
		s.metrics.reports.WithLabelValues("unknown").Inc()
		w.WriteHeader(http.StatusNoContent)
		return
	case err == nil:
		err = s.budget.Refund(context.WithoutCancel(r.Context()), budgetKey)
		if err == nil {
			s.onUndelivered(r.Context(), rp, prefix)
			w.WriteHeader(http.StatusNoContent)
			return
		}
		// Remembered again, so that the report sent again refunds.
		_ = s.bounded(context.WithoutCancel(r.Context()), func(ctx context.Context) error {
			return s.client.SetNX(ctx, sentKey(id), prefix, sentTTL).Err()
		})
	}
	s.metrics.redisErrors.Inc()
	s.log.Error("delivery report not taken", "id", id, "err", err)
	writeJSON(w, http.StatusServiceUnavailable, reply{Error: "service unavailable, try again later", RetryAfter: seconds(time.Second)})
}

// onUndelivered is told, once per message, of each message to prefix that
// its provider reported undelivered, after the budget's refund. Whatever
// else should hear of undelivered codes (the conversion guard: a prefix
// whose codes are not delivered is not converting) is called from here.
func (s *Service) onUndelivered(ctx context.Context, rp report, prefix string) {
	s.metrics.reports.WithLabelValues("undelivered").Inc()
	s.log.Info("code not delivered: the budget's unit is given back", "id", rp.id, "prefix", prefix)
	if _, err := s.undelivered(context.WithoutCancel(ctx), rp.to); err != nil {
		s.log.Warn("the conversion guard did not hear of an undelivered code", "id", rp.id, "err", err)
	}
}

// A report is what a genuine delivery report says: the message's id, the
// number it was sent to, and whether it was not delivered.
type report struct {
	id, to      string
	undelivered bool
}
