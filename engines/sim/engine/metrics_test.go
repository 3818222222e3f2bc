package engine

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

func gather(t testing.TB, e *Engine) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := e.Registry().Gather()
	require.NoError(t, err)
	out := make(map[string]*dto.MetricFamily, len(fams))
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func bucketBounds(f *dto.MetricFamily) []float64 {
	var out []float64
	for _, b := range f.GetMetric()[0].GetHistogram().GetBucket() {
		out = append(out, b.GetUpperBound())
	}
	return out
}

func TestMetricsExposition(t *testing.T) {
	tests := []struct {
		flavour string
		// name -> labels every series must carry
		want    map[string]map[string]string
		buckets map[string][]float64
		values  map[string]float64
	}{
		{
			flavour: FlavourVLLM,
			want: map[string]map[string]string{
				"vllm:num_requests_running":        {"model_name": "m", "engine": "0"},
				"vllm:num_requests_waiting":        {"model_name": "m", "engine": "0"},
				"vllm:kv_cache_usage_perc":         {"model_name": "m", "engine": "0"},
				"vllm:prefix_cache_queries_total":  {"model_name": "m", "engine": "0"},
				"vllm:prefix_cache_hits_total":     {"model_name": "m", "engine": "0"},
				"vllm:prompt_tokens_total":         {"model_name": "m", "engine": "0"},
				"vllm:generation_tokens_total":     {"model_name": "m", "engine": "0"},
				"vllm:num_preemptions_total":       {"model_name": "m", "engine": "0"},
				"vllm:request_success_total":       {"model_name": "m", "engine": "0"},
				"vllm:time_to_first_token_seconds": {"model_name": "m", "engine": "0"},
				"vllm:inter_token_latency_seconds": {"model_name": "m", "engine": "0"},
				"vllm:e2e_request_latency_seconds": {"model_name": "m", "engine": "0"},
				"vllm:request_queue_time_seconds":  {"model_name": "m", "engine": "0"},
				"vllm:cache_config_info": {"engine": "0", "block_size": "4", "num_gpu_blocks": "64",
					"num_cpu_blocks": "8", "enable_prefix_caching": "True", "prefix_caching_hash_algo": "sha256"},
			},
			buckets: map[string][]float64{
				"vllm:time_to_first_token_seconds": vllmTTFTBuckets,
				"vllm:inter_token_latency_seconds": vllmITLBuckets,
				"vllm:e2e_request_latency_seconds": vllmRequestLatencyBuckets,
			},
			values: map[string]float64{
				"vllm:prompt_tokens_total":        20,
				"vllm:generation_tokens_total":    6,
				"vllm:prefix_cache_queries_total": 20,
				"vllm:prefix_cache_hits_total":    8,
				"vllm:cache_config_info":          1,
				"vllm:num_requests_running":       0,
			},
		},
		{
			flavour: FlavourSGLang,
			want: map[string]map[string]string{
				"sglang:num_running_reqs":            {"model_name": "m", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"},
				"sglang:num_queue_reqs":              {"model_name": "m", "tp_rank": "0"},
				"sglang:token_usage":                 {"model_name": "m"},
				"sglang:cache_hit_rate":              {"model_name": "m"},
				"sglang:num_used_tokens":             {"model_name": "m"},
				"sglang:kv_used_tokens":              {"model_name": "m"},
				"sglang:kv_available_tokens":         {"model_name": "m"},
				"sglang:kv_evictable_tokens":         {"model_name": "m"},
				"sglang:max_total_num_tokens":        {"model_name": "m"},
				"sglang:prompt_tokens_total":         {"model_name": "m", "engine_type": "unified"},
				"sglang:cached_tokens_total":         {"model_name": "m"},
				"sglang:num_requests_total":          {"model_name": "m"},
				"sglang:generation_tokens_total":     {"model_name": "m"},
				"sglang:time_to_first_token_seconds": {"model_name": "m"},
				"sglang:inter_token_latency_seconds": {"model_name": "m"},
				"sglang:e2e_request_latency_seconds": {"model_name": "m"},
				"sglang:cache_config_info":           {"page_size": "4", "num_pages": "64"},
			},
			buckets: map[string][]float64{
				"sglang:time_to_first_token_seconds": sglangTTFTBuckets,
				"sglang:inter_token_latency_seconds": sglangITLBuckets,
			},
			values: map[string]float64{
				"sglang:prompt_tokens_total":     20,
				"sglang:cached_tokens_total":     8,
				"sglang:generation_tokens_total": 6,
				"sglang:max_total_num_tokens":    256,
				"sglang:cache_hit_rate":          0.4,
				// Both requests left their 3 full blocks cached (deduplicated).
				"sglang:kv_evictable_tokens": 12,
				"sglang:kv_available_tokens": 256 - 12,
				"sglang:kv_used_tokens":      0,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.flavour, func(t *testing.T) {
			h := newHarness(t, Config{Flavour: tt.flavour, Model: "m", BlockSize: 4, NumGPUBlocks: 64, NumCPUBlocks: 8})
			h.complete("a", seq(1, 10), seq(100, 3))
			h.complete("b", seq(1, 10), seq(100, 3))
			fams := gather(t, h.e)
			for name, labels := range tt.want {
				f, ok := fams[name]
				require.True(t, ok, "missing %s", name)
				require.NotEmpty(t, f.GetMetric())
				for _, m := range f.GetMetric() {
					got := labelsOf(m)
					for k, v := range labels {
						require.Equal(t, v, got[k], "%s label %s", name, k)
					}
				}
			}
			for name, b := range tt.buckets {
				require.Equal(t, b, bucketBounds(fams[name]), name)
			}
			for name, v := range tt.values {
				m := fams[name].GetMetric()[0]
				var got float64
				switch {
				case m.GetCounter() != nil:
					got = m.GetCounter().GetValue()
				case m.GetGauge() != nil:
					got = m.GetGauge().GetValue()
				}
				require.InDelta(t, v, got, 1e-9, name)
			}
			for name := range fams {
				require.Contains(t, tt.want, name, "unexpected metric %s", name)
			}
		})
	}
}
