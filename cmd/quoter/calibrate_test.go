package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/discovery"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/sim"
	"github.com/omnious/provider-node/engines/sim/simtest"
	"github.com/omnious/provider-node/epp"
	"github.com/omnious/provider-node/extproc"
	"github.com/omnious/provider-node/extproc/testgw"
	"github.com/omnious/provider-node/quoter"
	"github.com/omnious/provider-node/quoter/calibration"
	"github.com/omnious/provider-node/scheduler"
)

// calibrationFleet is what `quoter calibrate` runs against in the tests:
// enginesim replicas behind the real EPP and the test gateway, all on
// 127.0.0.1 and stopped when the test ends.
type calibrationFleet struct {
	url, adminURL string
}

// durationOf is a pointer to d, for the configs' optional durations.
func durationOf(d time.Duration) *time.Duration { return &d }

// startCalibrationFleet runs two simulated replicas in real time (time
// scale 1, so the client and the engines measure the same latencies),
// with a decode step that grows 50ms per running request: their inter-token
// latency is about 90ms alone, 140ms at two and 240ms at four, so a 200ms
// objective (one of vLLM's ITL bucket bounds, where the engines' curve is
// read without interpolating inside a bucket) breaks within a few levels
// of the ladder. The steps are long because the client measures them on a
// busy machine: a 2-core CI runner under -race has added 15ms to the p95
// of an 11ms step, and a host at load average 10 broke the first level
// when it was 45ms against 100ms; the first level's 110ms of margin is
// what TestCalibrateCommand needs to hold. maxNumSeqs, when > 0, caps each replica's batch; with
// rejectSaturated the EPP queues nothing and answers 429 once the pool is
// saturated (admission.queue_capacity_per_band 0).
func startCalibrationFleet(t *testing.T, maxNumSeqs int, rejectSaturated bool) calibrationFleet {
	t.Helper()
	var eps []endpoint.Endpoint
	for range 2 {
		r := simtest.Start(t, func(c *sim.Config) {
			c.Engine.TimeScale = 1
			if maxNumSeqs > 0 {
				c.Engine.MaxNumSeqs = maxNumSeqs
			}
			tm := &c.Engine.Timing
			tm.PrefillBase, tm.PrefillPerToken = durationOf(time.Millisecond), durationOf(10*time.Microsecond)
			tm.DecodeBase, tm.DecodePerSeq, tm.KVTerm = durationOf(40*time.Millisecond), durationOf(50*time.Millisecond), durationOf(0)
		})
		eps = append(eps, endpoint.Endpoint{Addr: r.Addr(), Model: model, Engine: "vllm", MetricsURL: "http://" + r.Addr() + "/metrics"})
	}
	sc := scheduler.Config{Signals: scheduler.SignalsConfig{ScrapeInterval: 250 * time.Millisecond}}
	if rejectSaturated {
		sc.Admission.QueueCapacityPerBand = new(0)
	}
	cfg := epp.Config{GRPCAddr: "127.0.0.1:0", HealthAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0", AdminAddr: "127.0.0.1:0",
		StandInTokenizer: true, DrainDelay: durationOf(0), DrainTimeout: durationOf(0), Scheduler: sc}.WithDefaults()
	e, err := epp.New(cfg, discovery.Fixed(eps), zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	gw, err := testgw.New(testgw.Config{EPP: e.GRPCAddr()}, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	require.NoError(t, err)
	gdone := make(chan error, 1)
	go func() { gdone <- gw.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-gdone) })
	f := calibrationFleet{url: "http://" + gw.Addr(), adminURL: "http://" + e.AdminAddr()}
	// Both replicas healthy (scraped) before the ladder starts.
	cc := quoter.CapacityClient{URL: f.adminURL}
	require.Eventually(t, func() bool {
		snap, err := cc.Fetch(context.Background())
		m, _ := quoter.FindModel(snap, model)
		return err == nil && m.Healthy == 2
	}, 20*time.Second, 50*time.Millisecond)
	return f
}

func TestCalibrateCommand(t *testing.T) {
	f := startCalibrationFleet(t, 0, false)
	dir := t.TempDir()
	fleet := []string{"--url", f.url, "--model", model, "--capacity-url", f.adminURL, "--log-level", "warn"}
	// Short prompts and answers: a request takes 1.5-4s, so a 3s level
	// finishes some and measures many gaps.
	quick := []string{"--prompt-tokens", "64", "--shared-prefix-tokens", "16", "--groups", "2", "--output-tokens", "16",
		"--factor", "2", "--warmup", "500ms"}
	closed := fmt.Sprintf("http://127.0.0.1:%d", simtest.FreePort(t))

	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string // in stdout+stderr
		// written: the --out file holds a calibration afterwards.
		written bool
		// cancelAfter, when set, cancels the run then: it must end within
		// a few seconds, every worker with it.
		cancelAfter time.Duration
	}{
		{name: "calibrates", args: append(append([]string{"--slo-itl-p95", "200ms", "--slo-ttft-p95", "1s", "--level-duration", "3s"}, quick...), fleet...),
			code: exitOK, want: []string{"concurrency", "itl p95", "false", "engines' curve (one of 2 replicas)", "wrote "}, written: true},
		{name: "breaks at once", args: append(append([]string{"--slo-itl-p95", "1ms", "--level-duration", "1s", "--warmup", "0s"}, quick...), fleet...),
			code: exitFail, want: []string{"breaks its objectives at concurrency 1: ITL p95 ", " > 1ms"}},
		{name: "unreachable URL", args: append(append([]string{"--level-duration", "1s"}, fleet...), "--url", closed),
			code: exitFail, want: []string{closed + " cannot serve a calibration request", "connection refused"}},
		{name: "unknown model", args: append(append([]string{"--level-duration", "1s"}, fleet...), "--model", "other/model"),
			code: exitFail, want: []string{`model "other/model" is not in the EPP's capacity snapshot`}},
		{name: "unreachable EPP", args: append(append([]string{"--level-duration", "1s"}, fleet...), "--capacity-url", closed),
			code: exitFail, want: []string{"cannot read the capacity snapshot", "unreachable"}},
		{name: "cancelled", args: append(append([]string{"--level-duration", "1m", "--start-concurrency", "6"}, quick...), fleet...),
			cancelAfter: 6 * time.Second, code: exitFail, want: []string{"calibration stopped at concurrency 6: context deadline exceeded"}},
		{name: "no output", args: fleet, code: exitUsage, want: []string{"usage: quoter calibrate"}},
		{name: "bad mix", args: append([]string{"--prompt-tokens", "10", "--shared-prefix-tokens", "20"}, fleet...), code: exitUsage,
			want: []string{"shared prefix of 20 tokens is longer than the 10-token prompt", "usage: quoter calibrate"}},
		{name: "both outputs", args: append([]string{"--configmap", "cal"}, fleet...), code: exitUsage, want: []string{"usage: quoter calibrate"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".json")
			args := append([]string{"calibrate"}, tc.args...)
			if tc.name != "no output" {
				args = append(args, "--out", out)
			}
			timeout := 2 * time.Minute
			if tc.cancelAfter > 0 {
				timeout = tc.cancelAfter
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			code, stdout, stderr := invoke(ctx, args...)
			t.Log(stdout + stderr)
			if tc.cancelAfter > 0 {
				require.Less(t, time.Until(deadline(ctx)), 0*time.Second)
				require.Less(t, -time.Until(deadline(ctx)), 10*time.Second, "the run ends soon after it is cancelled")
				// Its workers end with it. Counted by their code, not by the
				// process's goroutines, which include the fleet serving this
				// test: idle they drift by a few, and under make test's load
				// they read 109 against 46 ten seconds after the cancel. Its
				// connections are closed by the command's own
				// CloseIdleConnections, which this does not see.
				require.Eventually(t, func() bool { return calibrationGoroutines() == 0 }, 10*time.Second, 50*time.Millisecond,
					"%d goroutines still run the calibration's code", calibrationGoroutines())
			}
			require.Equal(t, tc.code, code, stdout+stderr)
			for _, w := range tc.want {
				require.Contains(t, stdout+stderr, w)
			}
			if !tc.written {
				require.NoFileExists(t, out)
				return
			}
			cal, err := capacity.LoadCalibration(out)
			require.NoError(t, err)
			require.Equal(t, model, cal.Model)
			require.Equal(t, f.url, cal.URL)
			require.Equal(t, 2, cal.Replicas)
			require.Equal(t, capacity.Mix{PromptTokens: 64, SharedPrefixTokens: 16, Groups: 2, OutputTokens: 16}, cal.Mix)
			// The prompts were fitted to 64 of the engine's tokens, chat
			// template included (unfitted, 64 random words are about 100).
			require.InDelta(t, 64, cal.PromptTokensMeasured, 0.02*64+1)
			obj := capacity.Objectives{TTFT: time.Second, ITL: 200 * time.Millisecond, Quantile: 0.95}
			require.Equal(t, capacity.ObjectivesJSON{TTFTSeconds: 1, ITLSeconds: 0.2, Quantile: 0.95}, cal.Objectives)
			at, err := cal.Curve.At(obj)
			require.NoError(t, err)
			require.Positive(t, at.Concurrency, "the engines hold the objectives at the first level, as the client saw")
			// The ladder climbs to one level past the first outside the
			// objectives, then measures again its highest level within,
			// and while that breaks the next one below, at most 2, until
			// one holds twice.
			climb := 1
			for climb < len(cal.Levels) && cal.Levels[climb].Concurrency > cal.Levels[climb-1].Concurrency {
				climb++
			}
			require.GreaterOrEqual(t, climb, 3)
			broke := climb - 2
			for i, l := range cal.Levels[:broke+1] {
				require.Equal(t, i < broke, l.Within, "level %d", i)
			}
			for i, l := range cal.Levels {
				require.Positive(t, l.Requests)
				require.Zero(t, l.Errors)
				require.Positive(t, l.OutputTokensPerSec)
				if i > 0 && i < climb {
					require.Equal(t, max(cal.Levels[i-1].Concurrency+1, 2*cal.Levels[i-1].Concurrency), l.Concurrency)
				}
			}
			require.Greater(t, cal.Levels[broke].ITLP95Seconds, obj.ITL.Seconds())
			var within []int // the climb's levels within, highest first
			for _, l := range slices.Backward(cal.Levels[:climb]) {
				if l.Within {
					within = append(within, l.Concurrency)
				}
			}
			repeats := cal.Levels[climb:]
			require.NotEmpty(t, repeats)
			require.LessOrEqual(t, len(repeats), 2)
			refuted := map[int]bool{}
			for i, r := range repeats {
				require.Equal(t, within[i], r.Concurrency, "repeat %d: the next level within, down", i)
				if i < len(repeats)-1 {
					require.False(t, r.Within, "the repeats stop at the first that holds")
				}
				refuted[r.Concurrency] = !r.Within
			}
			held, ok := cal.HeldStreams(obj)
			require.True(t, ok)
			want := 0.0
			for _, c := range within {
				if !refuted[c] {
					want = float64(c)
					break
				}
			}
			require.Equal(t, want, held, "the highest level held every time it was measured")
		})
	}
}

func deadline(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// TestCalibrateStopsAtAFailingLevelPastTheBreak: past the first level
// outside the objectives, a level whose requests fail is the overload,
// not a broken URL. The ladder stops there and the calibration keeps what
// it measured. Two replicas of at most 4 running requests, behind an EPP
// that answers 429 once the pool is saturated rather than queueing: 8
// requests run (4 each, ITL about 240ms, outside 200ms), 16 leave 8 waiting
// and are mostly refused.
func TestCalibrateStopsAtAFailingLevelPastTheBreak(t *testing.T) {
	f := startCalibrationFleet(t, 4, true)
	out := filepath.Join(t.TempDir(), "cal.json")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code, stdout, stderr := invoke(ctx, "calibrate", "--url", f.url, "--model", model, "--capacity-url", f.adminURL,
		"--log-level", "info", "--slo-itl-p95", "200ms", "--slo-ttft-p95", "1s", "--level-duration", "2s", "--warmup", "500ms",
		"--prompt-tokens", "64", "--shared-prefix-tokens", "16", "--groups", "2", "--output-tokens", "16", "--factor", "2",
		"--past-break", "3", "--max-concurrency", "64", "--out", out)
	t.Log(stdout + stderr)
	require.Equal(t, exitOK, code, stdout+stderr)
	require.Contains(t, stderr, "level past the first break failed; the ladder stops")
	require.Regexp(t, `the ladder stops","concurrency":16,"error":"[0-9]+ of [0-9]+ requests failed at concurrency 16 .*status 429`, stderr)
	cal, err := capacity.LoadCalibration(out)
	require.NoError(t, err)
	// The climb ends below 16, outside the objectives (16 failed and is
	// not kept); then its highest level within is measured again.
	climb, top := 1, cal.Levels[0].Concurrency
	for climb < len(cal.Levels) && cal.Levels[climb].Concurrency > cal.Levels[climb-1].Concurrency {
		if cal.Levels[climb].Within {
			top = cal.Levels[climb].Concurrency
		}
		climb++
	}
	last := cal.Levels[climb-1]
	require.Less(t, last.Concurrency, 16, "the failing level is not kept")
	require.False(t, last.Within)
	require.Less(t, climb, len(cal.Levels), "the climb's top held is repeated after a failing level too")
	require.Equal(t, top, cal.Levels[climb].Concurrency)
	for _, l := range cal.Levels {
		require.Zero(t, l.Errors, "level %d", l.Concurrency)
	}
	_, err = cal.Curve.At(capacity.Objectives{TTFT: time.Second, ITL: 200 * time.Millisecond, Quantile: 0.95})
	require.NoError(t, err)
}

// TestWriteAtomic: the file is replaced whole or not at all, and no
// temporary file is left behind.
func TestWriteAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cal.json")
	for _, tc := range []struct {
		name    string
		path    string
		data    string
		wantErr string
		want    string // path's content afterwards
	}{
		{name: "new", path: path, data: "one", want: "one"},
		{name: "replaced", path: path, data: "two", want: "two"},
		{name: "missing directory", path: filepath.Join(dir, "none", "cal.json"), data: "x", wantErr: "cannot write"},
		{name: "over a directory", path: dir, data: "x", wantErr: "cannot replace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := writeAtomic(tc.path, []byte(tc.data))
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
				got, err := os.ReadFile(tc.path)
				require.NoError(t, err)
				require.Equal(t, tc.want, string(got))
			}
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			for _, e := range entries {
				require.False(t, strings.HasPrefix(e.Name(), "."), "temporary file %s left behind", e.Name())
			}
		})
	}
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "two", string(got), "a failed write leaves the file as it was")
}

// TestCalibrationHeaderIsTheEPPs: the mark calibrate sends is the one the
// EPP counts under the calibration tenant.
func TestCalibrationHeaderIsTheEPPs(t *testing.T) {
	require.Equal(t, extproc.HeaderCalibration, calibration.Header)
}

// calibrationGoroutines counts the goroutines running, or started by, the
// calibration package's code.
func calibrationGoroutines() int {
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	n := 0
	for _, g := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(g, "provider-node/quoter/calibration.") {
			n++
		}
	}
	return n
}
