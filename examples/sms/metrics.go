package main

import (
	"github.com/funnelguard/funnelguard/guard"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the service's Prometheus metrics, on a registry of its own.
type metrics struct {
	reg         *prometheus.Registry
	sends       *prometheus.CounterVec   // result
	denials     *prometheus.CounterVec   // guard, rule
	verifies    *prometheus.CounterVec   // outcome
	redisErrors prometheus.Counter       // calls Redis could not answer
	latency     *prometheus.HistogramVec // guard decision latency, by guard
	reports     *prometheus.CounterVec   // delivery reports, by result
	spend       *prometheus.CounterVec   // micros spent on sends delivered, by country
	spentToday  *prometheus.GaugeVec     // micros spent today (the budget's day), by country
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		sends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sms_sends_total", Help: "Send requests by result.",
		}, []string{"result"}),
		denials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sms_denials_total", Help: "Throttled send requests by guard and rule.",
		}, []string{"guard", "rule"}),
		verifies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sms_verify_total", Help: "Verifications by outcome.",
		}, []string{"outcome"}),
		redisErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sms_redis_errors_total", Help: "Rate-limit decisions Redis could not answer.",
		}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sms_guard_seconds", Help: "Latency of rate-limit decisions.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"guard"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sms_delivery_reports_total", Help: "Delivery reports by result: undelivered (refunded), other (a status that is no failure), unknown (a message not sent or already refunded), forbidden (bad signature).",
		}, []string{"result"}),
	}
	m.spend = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sms_spend_micros_total", Help: "Money spent on codes delivered, in millionths of the prices' currency, by country.",
	}, []string{"country"})
	m.spentToday = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sms_spend_today_micros", Help: "Money spent today (the budget's day), in millionths of the prices' currency, by country, as of the last send.",
	}, []string{"country"})
	m.reg.MustRegister(m.sends, m.denials, m.verifies, m.redisErrors, m.latency, m.reports, m.spend, m.spentToday)
	return m
}

// observe is the func of guard.WithObserve for the guard named name.
func (m *metrics) observe(name string) func(guard.Observation) {
	return func(o guard.Observation) {
		m.latency.WithLabelValues(name).Observe(o.Latency.Seconds())
		if o.Decision.Degraded {
			m.redisErrors.Inc()
		}
		if !o.Decision.Allowed && o.Decision.Rule != "" {
			m.denials.WithLabelValues(name, o.Decision.Rule).Inc()
		}
	}
}
