package metrics

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// hist builds the expected Histogram from bounds and cumulative counts.
func hist(bounds, counts []float64, count, sum float64) Histogram {
	h := Histogram{N: len(bounds), Count: count, Sum: sum}
	copy(h.Bounds[:], bounds)
	copy(h.Counts[:], counts)
	return h
}

func TestParseHistograms(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		engine    string
		ttft, itl Histogram
		wantErr   string
	}{
		{name: "vllm bucket sum count", engine: EngineVLLM, in: `# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 3
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.25",model_name="m"} 5
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 6
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 1.5
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 6
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="m"} 10
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.025",model_name="m"} 40
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 41
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 0.75
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 41
`,
			ttft: hist([]float64{0.1, 0.25}, []float64{3, 5}, 6, 1.5),
			itl:  hist([]float64{0.01, 0.025}, []float64{10, 40}, 41, 0.75)},
		{name: "sglang bucket sum count", engine: EngineSGLang, in: `sglang:time_to_first_token_seconds_bucket{engine_type="unified",le="0.1",model_name="m"} 2.0
sglang:time_to_first_token_seconds_bucket{engine_type="unified",le="+Inf",model_name="m"} 2.0
sglang:time_to_first_token_seconds_sum{engine_type="unified",model_name="m"} 0.1
sglang:time_to_first_token_seconds_count{engine_type="unified",model_name="m"} 2.0
sglang:inter_token_latency_seconds_bucket{engine_type="unified",le="0.002",model_name="m"} 0.0
sglang:inter_token_latency_seconds_bucket{engine_type="unified",le="0.004",model_name="m"} 7.0
sglang:inter_token_latency_seconds_bucket{engine_type="unified",le="+Inf",model_name="m"} 9.0
sglang:inter_token_latency_seconds_sum{engine_type="unified",model_name="m"} 0.05
sglang:inter_token_latency_seconds_count{engine_type="unified",model_name="m"} 9.0
`,
			ttft: hist([]float64{0.1}, []float64{2}, 2, 0.1),
			itl:  hist([]float64{0.002, 0.004}, []float64{0, 7}, 9, 0.05)},
		{name: "data-parallel ranks summed", engine: EngineVLLM, in: `vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01"} 1
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.025"} 4
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf"} 5
vllm:inter_token_latency_seconds_sum{engine="0"} 0.1
vllm:inter_token_latency_seconds_count{engine="0"} 5
vllm:inter_token_latency_seconds_bucket{engine="1",le="0.01"} 2
vllm:inter_token_latency_seconds_bucket{engine="1",le="0.025"} 2
vllm:inter_token_latency_seconds_bucket{engine="1",le="+Inf"} 3
vllm:inter_token_latency_seconds_sum{engine="1"} 0.2
vllm:inter_token_latency_seconds_count{engine="1"} 3
`,
			itl: hist([]float64{0.01, 0.025}, []float64{3, 6}, 8, 0.3)},
		{name: "sglang data-parallel ranks summed", engine: EngineSGLang, in: `sglang:time_to_first_token_seconds_bucket{dp_rank="0",le="0.1"} 1
sglang:time_to_first_token_seconds_bucket{dp_rank="1",le="0.1"} 2
sglang:time_to_first_token_seconds_bucket{dp_rank="0",le="0.2"} 3
sglang:time_to_first_token_seconds_bucket{dp_rank="1",le="0.2"} 4
sglang:time_to_first_token_seconds_sum{dp_rank="0"} 0.5
sglang:time_to_first_token_seconds_sum{dp_rank="1"} 0.25
sglang:time_to_first_token_seconds_count{dp_rank="0"} 3
sglang:time_to_first_token_seconds_count{dp_rank="1"} 4
`,
			ttft: hist([]float64{0.1, 0.2}, []float64{3, 7}, 7, 0.75)},
		{name: "buckets out of order are sorted", engine: EngineVLLM, in: `vllm:time_to_first_token_seconds_bucket{le="0.25"} 5
vllm:time_to_first_token_seconds_bucket{le="+Inf"} 5
vllm:time_to_first_token_seconds_bucket{le="0.1"} 3
vllm:time_to_first_token_seconds_count 5
`,
			ttft: hist([]float64{0.1, 0.25}, []float64{3, 5}, 5, 0)},
		{name: "old time_per_output_token used without inter_token_latency", engine: EngineVLLM, in: `vllm:time_per_output_token_seconds_bucket{le="0.01"} 4
vllm:time_per_output_token_seconds_bucket{le="+Inf"} 6
vllm:time_per_output_token_seconds_sum 0.07
vllm:time_per_output_token_seconds_count 6
`,
			itl: hist([]float64{0.01}, []float64{4}, 6, 0.07)},
		{name: "sglang time_per_output_token used without inter_token_latency", engine: EngineSGLang, in: `sglang:time_per_output_token_seconds_bucket{le="0.01"} 1
sglang:time_per_output_token_seconds_bucket{le="+Inf"} 2
sglang:time_per_output_token_seconds_sum 0.03
sglang:time_per_output_token_seconds_count 2
`,
			itl: hist([]float64{0.01}, []float64{1}, 2, 0.03)},
		{name: "inter_token_latency wins over time_per_output_token", engine: EngineVLLM, in: `vllm:time_per_output_token_seconds_bucket{le="0.01"} 4
vllm:time_per_output_token_seconds_bucket{le="+Inf"} 6
vllm:time_per_output_token_seconds_sum 0.07
vllm:time_per_output_token_seconds_count 6
vllm:inter_token_latency_seconds_bucket{le="0.025"} 9
vllm:inter_token_latency_seconds_bucket{le="+Inf"} 9
vllm:inter_token_latency_seconds_sum 0.1
vllm:inter_token_latency_seconds_count 9
`,
			itl: hist([]float64{0.025}, []float64{9}, 9, 0.1)},
		{name: "inter_token_latency with no observation yet still wins", engine: EngineVLLM, in: `vllm:inter_token_latency_seconds_bucket{le="0.025"} 0
vllm:inter_token_latency_seconds_bucket{le="+Inf"} 0
vllm:inter_token_latency_seconds_sum 0
vllm:inter_token_latency_seconds_count 0
vllm:time_per_output_token_seconds_bucket{le="0.01"} 4
vllm:time_per_output_token_seconds_count 6
`,
			itl: hist([]float64{0.025}, []float64{0}, 0, 0)},
		{name: "only the +Inf bucket gives no bound", engine: EngineVLLM, in: `vllm:num_requests_running 1
vllm:time_to_first_token_seconds_bucket{le="+Inf"} 4
vllm:time_to_first_token_seconds_sum 2
vllm:time_to_first_token_seconds_count 4
`,
			ttft: hist(nil, nil, 4, 2)},
		{name: "bucket without le", in: "vllm:time_to_first_token_seconds_bucket{engine=\"0\"} 3\n", wantErr: errNoLe.Error()},
		{name: "bucket without labels", in: "vllm:inter_token_latency_seconds_bucket 3\n", wantErr: errNoLe.Error()},
		{name: "bucket with a bad le", in: "sglang:inter_token_latency_seconds_bucket{le=\"fast\"} 3\n", wantErr: errNoLe.Error()},
		{name: "bucket with a negative le", in: "vllm:time_to_first_token_seconds_bucket{le=\"-1\"} 3\n", wantErr: errNoLe.Error()},
		{name: "bucket with a NaN le", in: "vllm:time_to_first_token_seconds_bucket{le=\"NaN\"} 3\n", wantErr: errNoLe.Error()},
		{name: "bad count value", in: "vllm:time_to_first_token_seconds_count x\n", wantErr: "bad value"},
		{name: "unrecognised histogram ignored", engine: EngineVLLM, in: `vllm:e2e_request_latency_seconds_bucket{nole="x"} 3
vllm:num_requests_running 2
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s Signals
			err := Parse([]byte(tt.in), &s)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.engine, s.Engine)
			require.Equal(t, tt.ttft.N, s.TTFT.N)
			require.Equal(t, tt.itl.N, s.ITL.N)
			require.InDeltaSlice(t, tt.ttft.Bounds[:], s.TTFT.Bounds[:], 1e-12)
			require.InDeltaSlice(t, tt.ttft.Counts[:], s.TTFT.Counts[:], 1e-12)
			require.InDelta(t, tt.ttft.Count, s.TTFT.Count, 1e-12)
			require.InDelta(t, tt.ttft.Sum, s.TTFT.Sum, 1e-12)
			require.InDeltaSlice(t, tt.itl.Bounds[:], s.ITL.Bounds[:], 1e-12)
			require.InDeltaSlice(t, tt.itl.Counts[:], s.ITL.Counts[:], 1e-12)
			require.InDelta(t, tt.itl.Count, s.ITL.Count, 1e-12)
			require.InDelta(t, tt.itl.Sum, s.ITL.Sum, 1e-12)
			require.Equal(t, tt.ttft.N > 0, s.Has&HasTTFT != 0, "HasTTFT")
			require.Equal(t, tt.itl.N > 0, s.Has&HasITL != 0, "HasITL")
		})
	}
}

func TestHistogramDelta(t *testing.T) {
	bounds := []float64{0.01, 0.025}
	prev := hist(bounds, []float64{10, 40}, 50, 1.0)
	tests := []struct {
		name   string
		prev   Histogram
		next   Histogram
		want   Histogram
		wantOK bool
	}{
		{"observations in the window", prev, hist(bounds, []float64{15, 60}, 75, 1.6),
			hist(bounds, []float64{5, 20}, 25, 0.6), true},
		{"no observation", prev, prev, hist(bounds, []float64{0, 0}, 0, 0), true},
		{"no previous histogram", Histogram{}, prev, prev, true},
		{"engine restart: count went down", prev, hist(bounds, []float64{1, 2}, 3, 0.05), Histogram{}, false},
		{"engine restart: a bucket went down", prev, hist(bounds, []float64{9, 45}, 55, 1.1), Histogram{}, false},
		{"other buckets", prev, hist([]float64{0.01, 0.05}, []float64{15, 60}, 75, 1.6), Histogram{}, false},
		{"fewer buckets", prev, hist(bounds[:1], []float64{15}, 75, 1.6), Histogram{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, ok := tt.next.Delta(&tt.prev)
			require.Equal(t, tt.wantOK, ok)
			require.Equal(t, tt.want.N, d.N)
			require.Equal(t, tt.want.Bounds, d.Bounds)
			require.InDeltaSlice(t, tt.want.Counts[:], d.Counts[:], 1e-9)
			require.InDelta(t, tt.want.Count, d.Count, 1e-9)
			require.InDelta(t, tt.want.Sum, d.Sum, 1e-9)
		})
	}
}

// TestDeriveFromRestart: a window across an engine restart says nothing and
// a counter that went down gives no rate.
func TestDeriveFromRestart(t *testing.T) {
	parse := func(in string) Signals {
		var s Signals
		require.NoError(t, Parse([]byte(in), &s))
		return s
	}
	before := `vllm:num_requests_running 4
vllm:num_requests_waiting 3
vllm:generation_tokens_total 1000
vllm:inter_token_latency_seconds_bucket{le="0.025"} 900
vllm:inter_token_latency_seconds_count 1000
vllm:inter_token_latency_seconds_sum 15
`
	later := `vllm:num_requests_running 6
vllm:num_requests_waiting 2
vllm:generation_tokens_total 1500
vllm:inter_token_latency_seconds_bucket{le="0.025"} 1300
vllm:inter_token_latency_seconds_count 1500
vllm:inter_token_latency_seconds_sum 22
`
	restarted := `vllm:num_requests_running 2
vllm:generation_tokens_total 20
vllm:inter_token_latency_seconds_bucket{le="0.025"} 10
vllm:inter_token_latency_seconds_count 12
vllm:inter_token_latency_seconds_sum 0.2
`
	t0 := time.Unix(1_800_000_000, 0)
	prev := &Sample{Signals: parse(before), At: t0}
	next := &Sample{Signals: parse(later), At: t0.Add(2 * time.Second)}
	next.DeriveFrom(prev)
	require.InDelta(t, 2.0, next.Window.Seconds, 1e-9)
	require.InDelta(t, 5.0, next.Window.Running, 1e-9)
	require.InDelta(t, 2.5, next.Window.Waiting, 1e-9)
	require.InDelta(t, 2.0, next.Window.WaitingMin, 1e-9, "queued at both ends")
	require.InDelta(t, 500.0, next.Window.ITL.Count, 1e-9)
	require.InDelta(t, 400.0, next.Window.ITL.Counts[0], 1e-9)
	require.InDelta(t, 250.0, next.GenerationTokensPerSec, 1e-9)

	after := &Sample{Signals: parse(restarted), At: t0.Add(4 * time.Second)}
	after.DeriveFrom(next)
	require.Zero(t, after.Window.Seconds, "a window across a restart")
	require.Zero(t, after.GenerationTokensPerSec, "a counter that went down")
}
