package engine

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Histogram buckets as the engines define them (vllm/v1/metrics/loggers.py,
// sglang/srt/metrics/collector.py).
var (
	vllmTTFTBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
		0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	vllmITLBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
		1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	vllmRequestLatencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
		30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}

	sglangTTFTBuckets = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400}
	sglangITLBuckets  = []float64{0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035,
		0.040, 0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000}
	sglangE2EBuckets = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200,
		400, 600, 1200, 1800, 2400}
)

// vLLM's FinishReason values, all pre-created as vLLM does.
var vllmFinishReasons = []string{"stop", "length", "abort"}

// metrics holds the request-level instruments; engine-state gauges and
// counters are read from the engine at scrape time.
type metrics struct {
	flavour string
	ttft    prometheus.Observer
	itl     prometheus.Observer
	e2e     prometheus.Observer
	queue   prometheus.Observer // vLLM only

	success map[string]prometheus.Counter // vLLM: by finished_reason

	// SGLang's tokenizer counts tokens when a request finishes.
	sglPrompt, sglGen, sglCached, sglRequests prometheus.Counter
}

func newMetrics(e *Engine) (*metrics, error) {
	if e.cfg.Flavour == FlavourSGLang {
		return newSGLangMetrics(e)
	}
	return newVLLMMetrics(e)
}

// stat reads one engine statistic under the engine lock at scrape time.
func (e *Engine) stat(f func(s *Stats) float64) func() float64 {
	return func() float64 {
		s := e.Snapshot()
		return f(&s)
	}
}

func newVLLMMetrics(e *Engine) (*metrics, error) {
	cfg := e.cfg
	labels := prometheus.Labels{"model_name": cfg.Model, "engine": "0"}
	m := &metrics{flavour: FlavourVLLM, success: make(map[string]prometheus.Counter)}
	gauge := func(name, help string, f func(s *Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, e.stat(f))
	}
	counter := func(name, help string, f func(s *Stats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, e.stat(f))
	}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: labels, Buckets: buckets})
	}
	ttft := hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", vllmTTFTBuckets)
	itl := hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", vllmITLBuckets)
	e2e := hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", vllmRequestLatencyBuckets)
	queue := hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", vllmRequestLatencyBuckets)
	m.ttft, m.itl, m.e2e, m.queue = ttft, itl, e2e, queue
	success := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vllm:request_success_total", Help: "Count of successfully processed requests.", ConstLabels: labels,
	}, []string{"finished_reason"})
	for _, r := range vllmFinishReasons {
		m.success[r] = success.WithLabelValues(r)
	}
	numCPU := "None"
	if cfg.NumCPUBlocks > 0 {
		numCPU = strconv.Itoa(cfg.NumCPUBlocks)
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig",
		ConstLabels: prometheus.Labels{
			"block_size":               strconv.Itoa(cfg.BlockSize),
			"cache_dtype":              "auto",
			"calculate_kv_scales":      "False",
			"cpu_offload_gb":           "0",
			"enable_prefix_caching":    pyBool(!cfg.DisablePrefixCaching),
			"engine":                   "0",
			"gpu_memory_utilization":   "0.9",
			"is_attention_free":        "False",
			"num_cpu_blocks":           numCPU,
			"num_gpu_blocks":           strconv.Itoa(cfg.NumGPUBlocks),
			"num_gpu_blocks_override":  "None",
			"prefix_caching_hash_algo": "sha256",
			"sliding_window":           "None",
			"swap_space":               "4",
		},
	})
	info.Set(1)
	cs := []prometheus.Collector{
		gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
			func(s *Stats) float64 { return float64(s.Running) }),
		gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
			func(s *Stats) float64 { return float64(s.Waiting) }),
		gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
			func(s *Stats) float64 { return s.KVUsage }),
		counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
			func(s *Stats) float64 { return float64(s.PrefixCacheQueries) }),
		counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
			func(s *Stats) float64 { return float64(s.PrefixCacheHits) }),
		counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.",
			func(s *Stats) float64 { return float64(s.PromptTokens) }),
		counter("vllm:generation_tokens_total", "Number of generation tokens processed.",
			func(s *Stats) float64 { return float64(s.GenerationTokens) }),
		counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.",
			func(s *Stats) float64 { return float64(s.Preemptions) }),
		success, ttft, itl, e2e, queue, info,
	}
	for _, c := range cs {
		if err := e.reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func newSGLangMetrics(e *Engine) (*metrics, error) {
	cfg := e.cfg
	bs := float64(cfg.BlockSize)
	// Scheduler metrics carry the rank labels; tokenizer metrics do not.
	sched := prometheus.Labels{"model_name": cfg.Model, "engine_type": "unified",
		"tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
	tok := prometheus.Labels{"model_name": cfg.Model, "engine_type": "unified"}
	m := &metrics{flavour: FlavourSGLang}
	gauge := func(name, help string, f func(s *Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: sched}, e.stat(f))
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: tok})
	}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: tok, Buckets: buckets})
	}
	ttft := hist("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", sglangTTFTBuckets)
	itl := hist("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", sglangITLBuckets)
	e2e := hist("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", sglangE2EBuckets)
	m.ttft, m.itl, m.e2e = ttft, itl, e2e
	m.sglPrompt = counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.")
	m.sglGen = counter("sglang:generation_tokens_total", "Number of generation tokens processed.")
	m.sglCached = counter("sglang:cached_tokens_total", "Number of cached prompt tokens.")
	m.sglRequests = counter("sglang:num_requests_total", "Number of requests processed.")
	infoLabels := prometheus.Labels{"page_size": strconv.Itoa(cfg.BlockSize), "num_pages": strconv.Itoa(cfg.NumGPUBlocks)}
	for k, v := range sched {
		infoLabels[k] = v
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{Name: "sglang:cache_config_info",
		Help: "Information of the cache configuration.", ConstLabels: infoLabels})
	info.Set(1)
	evictable := func() float64 { return float64(e.evictableBlocks()) * bs }
	cs := []prometheus.Collector{
		gauge("sglang:num_running_reqs", "The number of running requests.",
			func(s *Stats) float64 { return float64(s.Running) }),
		gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.",
			func(s *Stats) float64 { return float64(s.Waiting) }),
		gauge("sglang:token_usage", "The token usage.",
			func(s *Stats) float64 { return s.KVUsage }),
		gauge("sglang:cache_hit_rate", "The prefix cache hit rate.",
			func(s *Stats) float64 {
				if s.PrefixCacheQueries == 0 {
					return 0
				}
				return float64(s.PrefixCacheHits+s.CPUCacheHits) / float64(s.PrefixCacheQueries)
			}),
		gauge("sglang:num_used_tokens", "The number of used tokens.",
			func(s *Stats) float64 { return float64(s.UsedBlocks) * bs }),
		gauge("sglang:kv_used_tokens", "KV pool tokens held by running requests.",
			func(s *Stats) float64 { return float64(s.UsedBlocks) * bs }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sglang:kv_evictable_tokens",
			Help: "KV pool tokens held only by the prefix cache.", ConstLabels: sched}, evictable),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sglang:kv_available_tokens",
			Help: "KV pool tokens free without eviction.", ConstLabels: sched},
			func() float64 {
				return float64(cfg.NumGPUBlocks)*bs - float64(e.Snapshot().UsedBlocks)*bs - evictable()
			}),
		gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.",
			func(s *Stats) float64 { return float64(s.NumGPUBlocks) * bs }),
		m.sglPrompt, m.sglGen, m.sglCached, m.sglRequests, ttft, itl, e2e, info,
	}
	for _, c := range cs {
		if err := e.reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// evictableBlocks counts cached GPU blocks no request references.
func (e *Engine) evictableBlocks() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, b := range e.cache.gpu {
		if b.ref == 0 {
			n++
		}
	}
	return n
}

func (m *metrics) firstToken(r *request, at time.Duration) {
	m.ttft.Observe((at - r.arrival).Seconds())
}

func (m *metrics) interToken(d time.Duration) {
	m.itl.Observe(d.Seconds())
}

// finished records a request's end; reason is "stop", "length" or "abort".
func (m *metrics) finished(r *request, reason string, at time.Duration) {
	if m.flavour == FlavourSGLang {
		m.sglRequests.Inc()
		m.sglPrompt.Add(float64(len(r.Prompt)))
		m.sglGen.Add(float64(r.generated))
		m.sglCached.Add(float64(r.cachedTokens))
		if reason != "abort" {
			m.e2e.Observe((at - r.arrival).Seconds())
		}
		return
	}
	if c, ok := m.success[reason]; ok {
		c.Inc()
	}
	if reason == "abort" {
		return
	}
	m.e2e.Observe((at - r.arrival).Seconds())
	m.queue.Observe((r.firstSched - r.arrival).Seconds())
}

func pyBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}
