package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

func TestLoadWorkload(t *testing.T) {
	cases := []struct {
		name        string
		promptBytes int
	}{
		{"8k-token chat", 32 << 10},
		{"200 KB prompt", 200 << 10},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := LoadOptions{PromptBytes: tc.promptBytes, Groups: 4}.WithDefaults()
			w, err := newLoadWorkload(o)
			require.NoError(t, err)
			require.InDelta(t, tc.promptBytes, w.bytes, 0.02*float64(tc.promptBytes), "body size")
			// About 4 bytes a token, as English with a real tokenizer.
			require.InDelta(t, tc.promptBytes/4, w.tokens, 0.15*float64(tc.promptBytes/4), "prompt tokens")
			seen := map[string]bool{}
			for i := 0; i < 8; i++ {
				b := w.body()
				var v struct {
					Model    string `json:"model"`
					Messages []struct{ Role, Content string }
				}
				require.NoError(t, json.Unmarshal(b, &v))
				require.Equal(t, o.Model, v.Model)
				require.Len(t, v.Messages, 2)
				require.False(t, seen[string(b)], "bodies are unique")
				seen[string(b)] = true
			}
			for g, sys := range w.system {
				// The system prompt is most of the prompt and whole blocks of it
				// reach the index.
				require.Greater(t, len(sys), w.tokens/2, "group %d", g)
			}
		})
	}
}

func TestLinearSlope(t *testing.T) {
	cases := []struct {
		name   string
		xs, ys []float64
		want   float64
	}{
		{"flat", []float64{0, 1, 2, 3}, []float64{5, 5, 5, 5}, 0},
		{"rising", []float64{0, 1, 2, 3}, []float64{1, 3, 5, 7}, 2},
		{"falling with noise", []float64{0, 1, 2, 3}, []float64{10, 9.5, 7.5, 7}, -1.1},
		{"one point", []float64{4}, []float64{9}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.InDelta(t, tc.want, linearSlope(tc.xs, tc.ys), 1e-9)
		})
	}
}

func TestSoakJudge(t *testing.T) {
	const mib = 1 << 20
	series := func(n int, heap0, heapStep, rss0, rssStep float64) []MemSample {
		var out []MemSample
		for i := 0; i < n; i++ {
			out = append(out, MemSample{At: float64(i * 10), Heap: heap0 + heapStep*float64(i), RSS: rss0 + rssStep*float64(i)})
		}
		return out
	}
	// spiky adds extra to the heap and RSS of every other sample in [from, to].
	spiky := func(ss []MemSample, from, to int, extra float64) []MemSample {
		for i := from; i <= to; i += 2 {
			ss[i].Heap += extra
			ss[i].RSS += extra
		}
		return ss
	}
	okLoad := LoadStep{OK: 1000}
	cases := []struct {
		name     string
		samples  []MemSample
		load     LoadStep
		wantErr  bool
		wantPass bool
		wantWhy  string
	}{
		{"flat memory passes", series(10, 40*mib, 0, 80*mib, 0), okLoad, false, true, ""},
		{"warm-up growth is ignored", append(series(1, 10*mib, 0, 20*mib, 0), series(9, 40*mib, 0, 80*mib, 0)[1:]...), okLoad, false, true, ""},
		{"growing heap fails", series(10, 40*mib, 8*mib, 80*mib, 0), okLoad, false, false, "heap floor grew"},
		{"growing RSS fails", series(10, 40*mib, 0, 80*mib, 8*mib), okLoad, false, false, "RSS floor grew"},
		{"transient spikes at the end pass", spiky(series(20, 40*mib, 0, 80*mib, 0), 15, 19, 80*mib), okLoad, false, true, ""},
		{"a rising floor under spikes fails", spiky(series(20, 40*mib, 4*mib, 80*mib, 0), 3, 9, 80*mib), okLoad, false, false, "heap floor grew"},
		{"errors fail", series(10, 40*mib, 0, 80*mib, 0), LoadStep{OK: 900, Errors: 100}, false, false, "100 errors"},
		{"too few samples", series(2, 40*mib, 0, 80*mib, 0), okLoad, true, false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := &SoakResult{Samples: tc.samples, Warmup: 10, MaxGrowth: 32 * mib, ErrorBudget: 0.001, Load: tc.load}
			err := r.judge()
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.wantPass, r.Pass, r.Why)
			require.Equal(t, tc.wantPass || tc.load.Errors > 0, r.MemoryPass, "the memory verdict ignores the load")
			require.Contains(t, r.Why, tc.wantWhy)
		})
	}
}

func TestScrapeValues(t *testing.T) {
	const page = "# HELP go_memstats_heap_inuse_bytes x\ngo_memstats_heap_inuse_bytes 1.5e+07\n" +
		"process_resident_memory_bytes 4.2e+07\ngo_memstats_heap_inuse_bytes_total 99\n" +
		"inference_objective_request_total{model_name=\"a\"} 3\ninference_objective_request_total{model_name=\"b\"} 4\n"
	cases := []struct {
		name    string
		names   []string
		want    []float64
		wantErr bool
	}{
		{"gauges", []string{"go_memstats_heap_inuse_bytes", "process_resident_memory_bytes"}, []float64{1.5e7, 4.2e7}, false},
		{"summed series", []string{"inference_objective_request_total"}, []float64{7}, false},
		{"missing", []string{"nope"}, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := scrapeValues(strings.NewReader(page), tc.names...)
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestRouteHistogram(t *testing.T) {
	const name = "omnious_extproc_route_duration_seconds"
	page := func(a, b, c, inf int) string {
		return fmt.Sprintf("# TYPE %[1]s histogram\n%[1]s_bucket{le=\"0.0001\"} %[2]d\n%[1]s_bucket{le=\"0.0002\"} %[3]d\n"+
			"%[1]s_bucket{le=\"0.0004\"} %[4]d\n%[1]s_bucket{le=\"+Inf\"} %[5]d\n%[1]s_sum 1\n%[1]s_count %[5]d\nother_bucket{le=\"1\"} 9\n",
			name, a, b, c, inf)
	}
	read := func(s string) []bucket {
		b, err := histogramBuckets(strings.NewReader(s), name)
		require.NoError(t, err)
		return b
	}
	before := read(page(10, 20, 20, 20))
	require.Len(t, before, 4)
	require.True(t, math.IsInf(before[3].le, 1))

	cases := []struct {
		name  string
		after []bucket
		q     float64
		want  float64
	}{
		// 100 new samples: 50 in (0, 100µs], 30 in (100, 200µs], 20 in (200, 400µs].
		{"median at the first bound", read(page(60, 100, 120, 120)), 0.5, 0.0001},
		{"p75 interpolated in the second", read(page(60, 100, 120, 120)), 0.75, 0.0001 + 0.0001*25/30},
		{"p99 in the third", read(page(60, 100, 120, 120)), 0.99, 0.0002 + 0.0002*19/20},
		{"rank past the last bound gives the bound", read(page(10, 20, 20, 30)), 0.5, 0.0004},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.InDelta(t, tc.want, histogramQuantile(tc.q, before, tc.after), 1e-12)
		})
	}
	require.True(t, math.IsNaN(histogramQuantile(0.5, before, before)), "nothing added")
	_, err := histogramBuckets(strings.NewReader("x 1\n"), name)
	require.ErrorContains(t, err, "not found")
	_, err = histogramBuckets(strings.NewReader(name+"_bucket{le=\"abc\"} 1\n"), name)
	require.ErrorContains(t, err, "cannot parse")
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// TestMain removes the binaries buildBins made.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// buildBins builds cmd/epp and cmd/bench once per test binary and returns
// their directory.
func buildBins(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		if binDir, binErr = os.MkdirTemp("", "bench-load-test-"); binErr != nil {
			return
		}
		for _, cmd := range []string{"epp", "bench"} {
			out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, cmd), filepath.Join(filepath.Dir(file), "..", "cmd", cmd)).CombinedOutput()
			if err != nil {
				binErr = fmt.Errorf("cannot build cmd/%s: %w: %s", cmd, err, out)
				return
			}
		}
	})
	require.NoError(t, binErr)
	return binDir
}

// TestRunLoad runs `bench load` briefly: the real EPP process, the test
// gateway and stubs, a two-rate ladder, a broken budget and a soak.
func TestRunLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the EPP as a process")
	}
	bins := buildBins(t)
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	base := LoadOptions{EPPBin: filepath.Join(bins, "epp"), FloorBin: filepath.Join(bins, "bench"), Dir: t.TempDir(), Replicas: 2, Groups: 4, PromptBytes: 8 << 10,
		Rates: []float64{20, 40}, Step: time.Second, StepWarmup: 300 * time.Millisecond, Log: log}
	cases := []struct {
		name  string
		tweak func(*LoadOptions)
		check func(t *testing.T, r *LoadReport)
	}{
		{"ladder within a loose budget", func(o *LoadOptions) { o.BudgetP99, o.AllRates = time.Minute, true }, func(t *testing.T, r *LoadReport) {
			require.Len(t, r.Steps, 2)
			require.Positive(t, r.IndexBlocks, "the stubs' KV events reached the index")
			var fastest *LoadStep
			for i, s := range r.Steps {
				require.Zero(t, s.Errors)
				require.Positive(t, s.OK)
				require.Positive(t, s.Decisions)
				require.Positive(t, s.EPPCores, "the EPP's CPU time is read")
				require.Positive(t, s.PerEPPCore)
				require.Positive(t, s.AddedP50)
				require.GreaterOrEqual(t, s.AddedP99, s.AddedP50)
				require.GreaterOrEqual(t, s.E2EP50, s.AddedP50, "the added latency is part of the whole")
				require.Positive(t, s.RouteP50, "the EPP's own share is read from its histogram")
				require.GreaterOrEqual(t, s.RouteP99, s.RouteP50)
				// Pass depends on the machine (a stall can delay the
				// step's answers past its window); Sustained must be the
				// fastest step that passed.
				if s.Pass && (fastest == nil || s.Decisions > fastest.Decisions) {
					fastest = &r.Steps[i]
				}
			}
			require.Equal(t, fastest, r.Sustained)
			require.GreaterOrEqual(t, r.EPPDecisions, float64(r.ClientOK), "the EPP routed every success")
		}},
		{"over loopback HTTP", func(o *LoadOptions) { o.BudgetP99, o.HTTP, o.Rates = time.Minute, true, o.Rates[:1] }, func(t *testing.T, r *LoadReport) {
			require.Len(t, r.Steps, 1)
			s := r.Steps[0]
			require.Zero(t, s.Errors)
			require.Positive(t, s.OK)
			require.GreaterOrEqual(t, s.E2EP50, s.AddedP50)
			require.GreaterOrEqual(t, r.EPPDecisions, float64(r.ClientOK))
		}},
		{"floor", func(o *LoadOptions) { o.BudgetP99, o.Floor = time.Minute, true }, func(t *testing.T, r *LoadReport) {
			require.True(t, r.Floor)
			require.Len(t, r.Steps, 2)
			for _, s := range r.Steps {
				require.Zero(t, s.Errors)
				require.Positive(t, s.OK)
				require.Positive(t, s.EPPCores, "the floor server's CPU time is read")
				require.Positive(t, s.AddedP50)
				require.Zero(t, s.RouteP50, "the floor has no route histogram")
			}
			require.Zero(t, r.IndexBlocks, "no KV events without an index")
			require.Zero(t, r.EPPDecisions)
			var b strings.Builder
			require.NoError(t, r.WriteTable(&b))
			require.Contains(t, b.String(), "no-op ext_proc server")
			require.NotContains(t, b.String(), "EPP decisions")
		}},
		{"a broken budget ends the ladder", func(o *LoadOptions) { o.BudgetP99 = time.Nanosecond }, func(t *testing.T, r *LoadReport) {
			require.Len(t, r.Steps, 1)
			require.Nil(t, r.Sustained)
			require.False(t, r.Steps[0].Pass)
			require.Contains(t, r.Steps[0].Why, "p99 added")
		}},
		{"soak", func(o *LoadOptions) {
			o.Soak, o.SoakRate, o.SoakSample, o.SoakWarmup = 2*time.Second, 30, 200*time.Millisecond, 500*time.Millisecond
			o.NoKVEvents, o.Tokenizer = true, "none"
		}, func(t *testing.T, r *LoadReport) {
			require.Empty(t, r.Steps)
			require.NotNil(t, r.Soak)
			require.GreaterOrEqual(t, len(r.Soak.Samples), 8)
			require.Positive(t, r.Soak.Heap.First)
			require.Positive(t, r.Soak.RSS.Max)
			require.True(t, r.Soak.Pass, r.Soak.Why)
			require.Zero(t, r.IndexBlocks)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			o.Dir = t.TempDir()
			tc.tweak(&o)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			r, err := RunLoad(ctx, o)
			require.NoError(t, err)
			var b strings.Builder
			require.NoError(t, r.WriteTable(&b))
			t.Log("\n" + b.String())
			tc.check(t, r)
		})
	}
}
