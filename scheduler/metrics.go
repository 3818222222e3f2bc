package scheduler

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Decision reasons and modes, as used on omnious_epp_decisions_total.
const (
	ReasonPrefix     = "prefix"
	ReasonRecall     = "recall"
	ReasonOverride   = "load_balance_override"
	ReasonCold       = "cold"
	ReasonSession    = "session"
	ReasonFallback   = "fallback"
	ReasonRandom     = "random"
	ReasonRoundRobin = "round_robin"
	ReasonLeastQueue = "least_queue"
	// ReasonSessionMove: the agent policy moved a session off the replica
	// holding its history, whose pending prefill work was over the bound.
	ReasonSessionMove = "session_move"

	ModePrecise     = "precise"
	ModeApproximate = "approximate"
)

var allReasons = []string{ReasonPrefix, ReasonRecall, ReasonOverride, ReasonCold, ReasonSession, ReasonFallback,
	ReasonRandom, ReasonRoundRobin, ReasonLeastQueue, ReasonSessionMove}

// schedMetrics are the scheduler's collectors. Names follow the Gateway API
// Inference Extension where the meaning is the same, so its dashboards work;
// the rest carry the omnious_epp_ prefix.
type schedMetrics struct {
	e2e        prometheus.Histogram
	hitRatio   prometheus.Histogram
	perPodQ    *prometheus.GaugeVec
	avgKV      prometheus.Gauge
	avgQueue   prometheus.Gauge
	avgRunning prometheus.Gauge
	readyPods  prometheus.Gauge

	// Request-level inference_objective_* metrics belong to the ext_proc
	// server, which sees every request and response; the scheduler counts
	// its own attempts and failures.
	attempts *prometheus.CounterVec
	errors   *prometheus.CounterVec
	// succeeded and failedAttempts are attempts' two children.
	succeeded, failedAttempts prometheus.Counter

	decisions    *prometheus.CounterVec
	decided      map[[2]string]prometheus.Counter
	breakerState *prometheus.GaugeVec
	score        *prometheus.GaugeVec
	queueDepth   *prometheus.GaugeVec
	queueWait    *prometheus.HistogramVec
	tenantTokens *prometheus.CounterVec
	stale        prometheus.Gauge
	replicaStale *prometheus.GaugeVec
	// capacityConcurrency and capacityDispersion summarise each replica's
	// capacity curve (GET /v1/capacity has it whole).
	capacityConcurrency, capacityDispersion *prometheus.GaugeVec
	capacityPrefill                         *prometheus.GaugeVec
	lookup                                  prometheus.Histogram
	outcomes                                [len(outcomeNames)]prometheus.Counter

	// Sessions (the agent policy and session admission).
	sessionMoves                   prometheus.Counter
	sessionsActive, sessionsQueued prometheus.Gauge
	sessionWorkingSet, sessionKV   prometheus.Gauge
	sessionResident                prometheus.Histogram
	sessionRefused                 *prometheus.CounterVec
	sessionAdmitted                *prometheus.CounterVec
	sessionWait                    prometheus.Histogram
}

func newSchedMetrics(reg prometheus.Registerer, pool string) (*schedMetrics, error) {
	pl := prometheus.Labels{"name": pool}
	m := &schedMetrics{
		e2e: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "inference_extension_scheduler_e2e_duration_seconds",
			Help:    "End-to-end scheduling latency of one decision (excluding flow-control queueing).",
			Buckets: []float64{5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2},
		}),
		hitRatio: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "inference_extension_prefix_indexer_hit_ratio",
			Help:    "Share of the prompt found cached on the chosen endpoint (0..1).",
			Buckets: prometheus.LinearBuckets(0, 0.1, 11),
		}),
		perPodQ: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inference_pool_per_pod_queue_size", Help: "Engine queue depth per endpoint.",
		}, []string{"name", "model_server_pod"}),
		avgKV: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inference_pool_average_kv_cache_utilization", Help: "Mean KV-cache utilisation over the pool (0..1).",
			ConstLabels: pl,
		}),
		avgQueue: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inference_pool_average_queue_size", Help: "Mean engine queue depth over the pool.", ConstLabels: pl,
		}),
		avgRunning: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inference_pool_average_running_requests", Help: "Mean running requests over the pool.", ConstLabels: pl,
		}),
		readyPods: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inference_pool_ready_pods", Help: "Endpoints with closed breakers and fresh metrics.", ConstLabels: pl,
		}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_extension_scheduler_attempts_total", Help: "Scheduling attempts by outcome (success or failure).",
		}, []string{"status"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "omnious_epp_schedule_errors_total", Help: "Scheduling failures by reason.",
		}, []string{"reason"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "omnious_epp_decisions_total", Help: "Scheduling decisions by reason and prefix mode.",
		}, []string{"reason", "mode"}),
		breakerState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "omnious_epp_breaker_state", Help: "Circuit breaker state per endpoint: 0 closed, 1 open, 2 half-open.",
		}, []string{"endpoint"}),
		score: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "omnious_epp_endpoint_score", Help: "Last total score of each endpoint when it was a candidate.",
		}, []string{"endpoint"}),
		queueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "omnious_epp_flow_queue_depth", Help: "Requests waiting in flow control, per band.",
		}, []string{"band"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "omnious_epp_flow_queue_wait_seconds", Help: "Time admitted requests waited in flow control, per band.",
			Buckets: []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30},
		}, []string{"band"}),
		tenantTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "omnious_epp_tenant_tokens_total", Help: "Tokens used per tenant; kind is prompt, cached or completion.",
		}, []string{"tenant", "kind"}),
		lookup: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "omnious_epp_kv_lookup_duration_seconds", Help: "Keying a prompt's tokens and matching them in the KV index.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 2, 16), // 1µs .. 33ms
		}),
		replicaStale: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "omnious_epp_replica_stale", Help: "1 when an endpoint's engine metrics are older than stale_after (scored down, still routable).",
		}, []string{"endpoint"}),
		stale: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "omnious_epp_stale_endpoints", Help: "Endpoints whose engine metrics are older than stale_after.",
		}),
		capacityConcurrency: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "omnious_epp_capacity_measured_concurrency", Help: "Largest concurrency (requests running or waiting in the engine) an endpoint's capacity curve has enough observations of; the quoter never sells beyond it.",
		}, []string{"endpoint"}),
		capacityDispersion: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "omnious_epp_capacity_dispersion", Help: "Variance over mean of an endpoint's running plus waiting count over its recent busy scrapes (1: Poisson; 0: not measured).",
		}, []string{"endpoint"}),
		capacityPrefill: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "omnious_epp_capacity_prefill_tokens_per_second", Help: "New (uncached) prompt tokens per second an endpoint computed while requests were queued with KV to spare, its prefill rate; it bounds the request rate the quoter sells (0: not measured).",
		}, []string{"endpoint"}),
	}
	m.sessionMoves = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "omnious_epp_session_moves_total", Help: "Session calls the agent policy sent off the replica holding the session's history, whose pending prefill work exceeded its prefill rate times the TTFT objective.",
	})
	m.sessionsActive = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "omnious_epp_sessions_active", Help: "Admitted sessions: from their first call until sessions.idle_timeout after their last.",
	})
	m.sessionsQueued = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "omnious_epp_sessions_queued", Help: "New sessions waiting for the active sessions' histories to leave room in the fleet's KV cache.",
	})
	m.sessionWorkingSet = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "omnious_epp_session_working_set_tokens", Help: "Sum of the active sessions' reservations (history, or last prompt plus the expected growth), tokens: the KV they need resident.",
	})
	m.sessionKV = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "omnious_epp_session_kv_budget_tokens", Help: "The fleet's KV capacity times sessions.kv_fraction, tokens (0: capacity not reported yet, nothing waits).",
	})
	m.sessionResident = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "omnious_epp_session_resident_tokens", Help: "Per session call, the tokens of its history the KV index showed resident on the chosen replica.",
		Buckets: prometheus.ExponentialBuckets(256, 2, 12), // 256 .. 512Ki
	})
	m.sessionRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "omnious_epp_sessions_refused_total", Help: "New sessions refused by session admission, by reason (session_queue_full, session_queue_expired).",
	}, []string{"reason"})
	m.sessionAdmitted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "omnious_epp_sessions_admitted_total", Help: "New sessions admitted by session admission, by reason (room: within the KV budget; spare_compute: past it, onto a replica with compute to spare).",
	}, []string{"reason"})
	m.sessionWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "omnious_epp_session_queue_wait_seconds", Help: "Time admitted new sessions waited in the session queue.",
		Buckets: []float64{0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120},
	})
	outcomes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "omnious_epp_request_outcomes_total",
		Help: "Routed requests by what their end says about the replica: success, failure (5xx) or unknown (no status, or the stream ended early); only failures count against a breaker.",
	}, []string{"outcome"})
	for _, c := range []prometheus.Collector{m.e2e, m.hitRatio, m.perPodQ, m.avgKV, m.avgQueue, m.avgRunning,
		m.readyPods, m.attempts, m.errors,
		m.decisions, m.breakerState, m.score, m.queueDepth, m.queueWait, m.tenantTokens, m.stale, m.replicaStale, m.lookup, outcomes,
		m.capacityConcurrency, m.capacityDispersion, m.capacityPrefill,
		m.sessionMoves, m.sessionsActive, m.sessionsQueued, m.sessionWorkingSet, m.sessionKV, m.sessionResident,
		m.sessionRefused, m.sessionAdmitted, m.sessionWait} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("cannot register scheduler metrics: %w", err)
		}
	}
	for o, name := range outcomeNames {
		m.outcomes[o] = outcomes.WithLabelValues(name)
	}
	m.succeeded, m.failedAttempts = m.attempts.WithLabelValues("success"), m.attempts.WithLabelValues("failure")
	m.decided = make(map[[2]string]prometheus.Counter)
	for _, r := range allReasons {
		for _, mode := range []string{ModePrecise, ModeApproximate, ""} {
			m.decided[[2]string{r, mode}] = m.decisions.WithLabelValues(r, mode)
		}
	}
	return m, nil
}

func (m *schedMetrics) decision(reason, mode string) {
	if c, ok := m.decided[[2]string{reason, mode}]; ok {
		c.Inc()
	}
}
