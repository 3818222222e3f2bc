package quoter

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the quoter's Prometheus series, all prefixed omnious_quoter_.
type metrics struct {
	breakerState     prometheus.Gauge
	transitions      *prometheus.CounterVec
	signed           prometheus.Counter
	published        prometheus.Counter
	failed           *prometheus.CounterVec
	lastExpiry       prometheus.Gauge
	lastSeq          prometheus.Gauge
	canary           *prometheus.CounterVec
	conformed        prometheus.Gauge
	headroomConc     prometheus.Gauge
	headroomTPS      prometheus.Gauge
	healthCheckFails *prometheus.CounterVec
	capacityConc     prometheus.Gauge
	capacityTPS      prometheus.Gauge
	calibrated       prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		breakerState: prometheus.NewGauge(prometheus.GaugeOpts{Name: "omnious_quoter_breaker_state",
			Help: "Health breaker state: 0 closed (signing), 1 half-open (probing), 2 open (not signing)."}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "omnious_quoter_breaker_transitions_total",
			Help: "Breaker transitions by target state."}, []string{"to"}),
		signed: prometheus.NewCounter(prometheus.CounterOpts{Name: "omnious_quoter_quotes_signed_total",
			Help: "Quotes signed."}),
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "omnious_quoter_quotes_published_total",
			Help: "Quotes accepted by the market URL."}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "omnious_quoter_quotes_failed_total",
			Help: "Quote failures by stage: sign (could not sign or persist seq), publish (a POST attempt failed), dropped (expired or superseded before the market accepted it)."},
			[]string{"stage"}),
		lastExpiry: prometheus.NewGauge(prometheus.GaugeOpts{Name: "omnious_quoter_last_quote_expiry_timestamp_seconds",
			Help: "Unix time at which the last signed quote expires."}),
		lastSeq: prometheus.NewGauge(prometheus.GaugeOpts{Name: "omnious_quoter_last_quote_seq",
			Help: "Sequence number of the last signed quote."}),
		canary: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "omnious_quoter_canary_probes_total",
			Help: "Canary probes by result."}, []string{"result"}),
		conformed: prometheus.NewGauge(prometheus.GaugeOpts{Name: "omnious_quoter_conformance_passed",
			Help: "1 once the pre-quote conformance gate has passed."}),
		headroomConc: prometheus.NewGauge(prometheus.GaugeOpts{Name: "omnious_quoter_headroom_concurrency",
			Help: "Concurrency headroom in the last signed quote."}),
		headroomTPS: prometheus.NewGauge(prometheus.GaugeOpts{Name: "omnious_quoter_headroom_tokens_per_second",
			Help: "Output tokens/s headroom in the last signed quote."}),
		healthCheckFails: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "omnious_quoter_health_check_failures_total",
			Help: "Failed health checks by reason."}, []string{"reason"}),
		capacityConc: prometheus.NewGauge(prometheus.GaugeOpts{Name: "omnious_quoter_capacity_concurrency",
			Help: "Requests a client may keep in flight on the healthy replicas within the latency objectives, at the last quote."}),
		capacityTPS: prometheus.NewGauge(prometheus.GaugeOpts{Name: "omnious_quoter_capacity_tokens_per_second",
			Help: "Output tokens/s the healthy replicas can serve within the latency objectives, at the last quote."}),
		calibrated: prometheus.NewGauge(prometheus.GaugeOpts{Name: "omnious_quoter_calibration_loaded",
			Help: "1 while a valid calibration for the model is loaded."}),
	}
	reg.MustRegister(m.breakerState, m.transitions, m.signed, m.published, m.failed, m.lastExpiry, m.lastSeq,
		m.canary, m.conformed, m.headroomConc, m.headroomTPS, m.healthCheckFails,
		m.capacityConc, m.capacityTPS, m.calibrated)
	for _, s := range []string{"sign", "publish", "dropped"} {
		m.failed.WithLabelValues(s)
	}
	for _, r := range []string{"pass", "fail"} {
		m.canary.WithLabelValues(r)
	}
	return m
}
