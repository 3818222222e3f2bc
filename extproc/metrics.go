package extproc

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics keeps the Inference Extension's inference_objective_* names so
// existing dashboards work, plus the server's own omnious_extproc_* ones.
type metrics struct {
	requests      *prometheus.CounterVec
	errors        *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	requestSizes  *prometheus.HistogramVec
	responseSizes *prometheus.HistogramVec
	inputTokens   *prometheus.HistogramVec
	outputTokens  *prometheus.HistogramVec
	cachedTokens  *prometheus.HistogramVec
	running       *prometheus.GaugeVec
	streams       *prometheus.CounterVec
	promptMode    *prometheus.CounterVec
	route         prometheus.Histogram
	rewrites      *prometheus.CounterVec
	fallbacks     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	models := []string{"model_name", "target_model_name"}
	sizeBuckets := prometheus.ExponentialBuckets(64, 4, 12)   // 64 B .. 268 MB
	tokenBuckets := prometheus.ExponentialBuckets(1, 2, 20)   // 1 .. 524288
	durBuckets := prometheus.ExponentialBuckets(0.005, 2, 18) // 5 ms .. 22 min
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_objective_request_total", Help: "Requests routed, by client-facing and target model.",
		}, models),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_objective_request_error_total", Help: "Requests that failed: EPP rejections by reason, upstream failures by class.",
		}, append(models, "error_code")),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "inference_objective_request_duration_seconds", Help: "From the request's arrival at the EPP to the end of its response.", Buckets: durBuckets,
		}, models),
		requestSizes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "inference_objective_request_sizes", Help: "Request body sizes in bytes.", Buckets: sizeBuckets,
		}, models),
		responseSizes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "inference_objective_response_sizes", Help: "Response body sizes in bytes, as the engine sent them.", Buckets: sizeBuckets,
		}, models),
		inputTokens: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "inference_objective_input_tokens", Help: "Prompt tokens from response usage.", Buckets: tokenBuckets,
		}, models),
		outputTokens: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "inference_objective_output_tokens", Help: "Completion tokens from response usage.", Buckets: tokenBuckets,
		}, models),
		cachedTokens: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "inference_objective_prompt_cached_tokens", Help: "Prefix-cache hits in tokens from response usage.", Buckets: tokenBuckets,
		}, models),
		running: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inference_objective_running_requests", Help: "Requests routed whose response has not ended.",
		}, []string{"model_name"}),
		streams: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "omnious_extproc_streams_total", Help: "ext_proc streams by how they ended: completed, immediate (EPP answered), cancelled, error, timeout (idle peer).",
		}, []string{"end"}),
		promptMode: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "omnious_extproc_prompt_mode_total", Help: "Routed requests by prompt knowledge: precise (exact tokens), approximate (raw prompt text) or none.",
		}, []string{"mode"}),
		route: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "omnious_extproc_route_duration_seconds",
			Help: "The EPP's own share of the routing latency: from the message that completed the request (body end or Content-Length reached, trailers, or bodyless headers) to the routing reply handed to gRPC, flow-control queueing included.",
			// 25 µs .. 0.8 s: a decision takes tens to hundreds of µs;
			// the upper buckets catch flow-control queueing.
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 16),
		}),
		rewrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_extension_model_rewrite_decisions_total", Help: "Requests whose model a rewrite rule (InferenceModelRewrite, or the endpoint file's rewrites) replaced, by rewrite, client model and target.",
		}, []string{"model_rewrite_name", "model_name", "target_model"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "omnious_extproc_model_fallbacks_total", Help: "Requests sent to one of their model's fallbacks, by the model that could not serve, the fallback, and why (no_endpoint, saturated).",
		}, []string{"model_name", "target_model_name", "reason"}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.requests, m.errors, m.duration, m.requestSizes, m.responseSizes,
		m.inputTokens, m.outputTokens, m.cachedTokens, m.running, m.streams, m.promptMode, m.route, m.rewrites, m.fallbacks} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	return m, errors.Join(errs...)
}

// series are the metric children of one (client, target) model label pair,
// resolved once: a request updates a dozen of them, and WithLabelValues
// hashes the label values and looks the child up every time. A lookup
// allocates nothing: TestAllocsSeries.
type series struct {
	requests                                prometheus.Counter
	incomplete, upstream5xx, upstream4xx    prometheus.Counter
	requestSizes, responseSizes, duration   prometheus.Observer
	inputTokens, outputTokens, cachedTokens prometheus.Observer
	running                                 prometheus.Gauge
}

// seriesOf returns the children of the label pair (client, target); both
// come from the bounded label sets, so the table is bounded too.
func (s *Server) seriesOf(client, target string) *series {
	key := [2]string{client, target}
	if m := s.series.Load(); m != nil {
		if v := (*m)[key]; v != nil {
			return v
		}
	}
	s.seriesMu.Lock()
	defer s.seriesMu.Unlock()
	old := s.series.Load()
	if old != nil {
		if v := (*old)[key]; v != nil {
			return v
		}
	}
	m := s.m
	v := &series{
		requests:      m.requests.WithLabelValues(client, target),
		incomplete:    m.errors.WithLabelValues(client, target, "upstream_incomplete"),
		upstream5xx:   m.errors.WithLabelValues(client, target, "upstream_5xx"),
		upstream4xx:   m.errors.WithLabelValues(client, target, "upstream_4xx"),
		requestSizes:  m.requestSizes.WithLabelValues(client, target),
		responseSizes: m.responseSizes.WithLabelValues(client, target),
		duration:      m.duration.WithLabelValues(client, target),
		inputTokens:   m.inputTokens.WithLabelValues(client, target),
		outputTokens:  m.outputTokens.WithLabelValues(client, target),
		cachedTokens:  m.cachedTokens.WithLabelValues(client, target),
		running:       m.running.WithLabelValues(client),
	}
	next := make(map[[2]string]*series, 1)
	if old != nil {
		next = make(map[[2]string]*series, len(*old)+1)
		for k, x := range *old {
			next[k] = x
		}
	}
	next[key] = v
	s.series.Store(&next)
	return v
}

// Label values of omnious_extproc_streams_total and
// omnious_extproc_prompt_mode_total.
var (
	streamEndValues  = []string{"completed", "immediate", "cancelled", "error", "timeout"}
	promptModeValues = []string{"precise", "approximate", "none"}
)

func children(v *prometheus.CounterVec, values []string) map[string]prometheus.Counter {
	m := make(map[string]prometheus.Counter, len(values))
	for _, x := range values {
		m[x] = v.WithLabelValues(x)
	}
	return m
}

// inc increments m's child for v, resolving v when m has none.
func inc(m map[string]prometheus.Counter, v *prometheus.CounterVec, x string) {
	if c, ok := m[x]; ok {
		c.Inc()
		return
	}
	v.WithLabelValues(x).Inc()
}

// modelLabels are the metric labels of the request's models: as chosen at
// routing, or before it names already known (a request for a model nobody
// serves is "unknown", so a client cannot mint label values).
func (st *stream) modelLabels() (client, target string) {
	if st.decision != nil {
		return st.clientLabel, st.targetLabel
	}
	s := st.s
	target = s.models.Known(st.targetModel)
	client = target
	if st.clientModel != st.targetModel {
		client = s.aliases.Known(st.clientModel)
	}
	return client, target
}
