package compare

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/bench/rig"
)

func TestMaxMean(t *testing.T) {
	require.InDelta(t, 1.5, maxMean([]float64{1, 3, 2}), 1e-12)
	require.True(t, math.IsNaN(maxMean([]float64{0, 0})))
}

func TestSummarise(t *testing.T) {
	t0 := time.Now()
	w := &rig.Workload{Stages: []rig.Stage{{QPS: 1, End: time.Second}, {QPS: 2, Start: time.Second, End: 2 * time.Second}}}
	res := []*rig.Result{
		{Stage: 0, Start: t0, TTFT: 10 * time.Millisecond, E2E: 100 * time.Millisecond, ITL: []time.Duration{time.Millisecond, 3 * time.Millisecond}, Output: 10, Prompt: 100, Cached: 50},
		{Stage: 1, Start: t0.Add(time.Second), TTFT: 30 * time.Millisecond, E2E: 1000 * time.Millisecond, Output: 30, Prompt: 100, Cached: 0},
		{Stage: 1, Start: t0.Add(time.Second), Err: io.ErrUnexpectedEOF},
	}
	delta := []rig.Counters{{OK: true, Queries: 100, Hits: 50, Requests: 1, PromptTokens: 100}, {OK: true, Queries: 100, Hits: 0, Requests: 1, PromptTokens: 100}}
	pr := summarise("p", w, res, delta, []time.Duration{time.Microsecond, 3 * time.Microsecond}, 2)
	require.Equal(t, 3, pr.Requests)
	require.Equal(t, 1, pr.Errors)
	require.Contains(t, pr.FirstError, "unexpected EOF")
	require.InDelta(t, 40, pr.TTFTP50, 1e-9) // (10+30)/2 ms, times 2
	require.InDelta(t, 4, pr.ITLP50, 1e-9)   // (1+3)/2 ms, times 2
	// 40 tokens over 2 s wall = 4 s model.
	require.InDelta(t, 10, pr.OutputTokPS, 1e-9)
	require.Equal(t, 4*time.Second, pr.Duration)
	require.InDelta(t, 0.25, pr.HitRate, 1e-12)
	require.InDelta(t, 0.25, pr.UsageCachedShare, 1e-12)
	require.InDelta(t, 1, pr.MaxMeanLoad, 1e-12)
	require.InDelta(t, 2.98, pr.DecisionP99us, 1e-9)
	require.Len(t, pr.Stages, 2)
	require.Equal(t, 2, pr.Stages[1].Requests)
	require.Equal(t, 1, pr.Stages[1].Errors)
	require.InDelta(t, 60, pr.Stages[1].TTFTP90ms, 1e-9)
	// A stage's throughput runs from its first send to its last end, as
	// inference-perf's: 10 tokens in 100 ms wall (200 ms model), 30 in 1 s
	// (the failed request ends at its send).
	require.InDelta(t, 50, pr.Stages[0].OutputTokPS, 1e-9)
	require.InDelta(t, 15, pr.Stages[1].OutputTokPS, 1e-9)
	// Sent 10 s late by a client at its concurrency bound, the stage's
	// requests take as long once sent: the wait is not the fleet's.
	for _, r := range res[1:] {
		r.Start = r.Start.Add(10 * time.Second)
	}
	require.InDelta(t, 15, summarise("p", w, res, delta, nil, 2).Stages[1].OutputTokPS, 1e-9)
	// Without prefix-cache counters the hit rate is unknown, not 0.
	delta[1].OK = false
	pr = summarise("p", w, res, delta, nil, 1)
	require.True(t, math.IsNaN(pr.HitRate))
	require.Equal(t, []float64{1, 1}, pr.LoadRequests)
	require.InDelta(t, 0.5, pr.LoadHitRate[0], 1e-12)
	require.True(t, math.IsNaN(pr.LoadHitRate[1]))
}

func sampleReport() *Report {
	mk := func(name string, ttft, tput, hit float64) PolicyResult {
		return PolicyResult{Policy: name, Requests: 10, TTFTP50: ttft / 2, TTFTP90: ttft, TTFTP99: ttft * 2, ITLP50: 10, ITLP99: 20,
			OutputTokPS: tput, HitRate: hit, MaxMeanLoad: 1.1, DecisionP99us: math.NaN(), LoadRequests: []float64{4, 6},
			LoadPromptTokens: []float64{400, 600}, LoadHitRate: []float64{hit, math.NaN()},
			Stages: []StageResult{{QPS: 1, Requests: 4, TTFTP90ms: ttft / 2, OutputTokPS: tput / 2}, {QPS: 3, Requests: 6, TTFTP90ms: ttft, OutputTokPS: tput}}}
	}
	return &Report{Scenario: "s<&>", Workload: "w", Replicas: 2, Simulated: true, TimeScale: 4, Bound: 0.5,
		BoundNote: "note", Requests: 10, Started: time.Unix(0, 0),
		Results: []PolicyResult{mk("random", 100, 50, 0.2), mk("precise", 20, 90, 0.45)}}
}

func TestContractJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.json")
	rep := sampleReport()
	rep.Results[0].Kind, rep.Results[0].EPPs = rig.KindPolicy, 2
	// An external EPP whose metrics were not known.
	rep.Results = append(rep.Results, PolicyResult{Policy: "peer", Kind: rig.KindExec, EPPs: 1, TTFTP90: 30, HitRate: 0.4, DecisionP99us: math.NaN(),
		EPP: &rig.EPPInfo{Addr: "127.0.0.1:9002", Requests: math.NaN()}})
	require.NoError(t, rep.WriteJSON(path))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(b, &doc))
	keys := func(m map[string]any) []string {
		var k []string
		for key := range m {
			k = append(k, key)
		}
		sort.Strings(k)
		return k
	}
	require.Equal(t, []string{"bound_hit_rate", "replicas", "results", "scenario"}, keys(doc))
	require.Equal(t, "s<&>", doc["scenario"])
	require.Equal(t, 2.0, doc["replicas"])
	require.Equal(t, 0.5, doc["bound_hit_rate"])
	results := doc["results"].([]any)
	require.Len(t, results, 3)
	r0 := results[0].(map[string]any)
	require.Equal(t, []string{"decision_p99_us", "epps", "errors", "hit_rate", "itl_p50_ms", "itl_p99_ms", "kind", "max_mean_load",
		"output_tok_per_s", "policy", "replicas", "requests", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms"}, keys(r0))
	// Each replica's share, in the fleet's order; a replica without
	// prefix-cache counters has no hit rate (null, not 0).
	require.Equal(t, []any{
		map[string]any{"requests": 4.0, "prompt_tokens": 400.0, "hit_rate": 0.2},
		map[string]any{"requests": 6.0, "prompt_tokens": 600.0, "hit_rate": nil},
	}, r0["replicas"])
	require.Equal(t, "random", r0["policy"])
	require.Equal(t, "policy", r0["kind"])
	require.Equal(t, 2.0, r0["epps"])
	require.Equal(t, 100.0, r0["ttft_p90_ms"])
	require.Nil(t, r0["decision_p99_us"]) // NaN is null, not 0
	r2 := results[2].(map[string]any)
	require.Equal(t, []string{"decision_p99_us", "decision_source", "epp_requests", "epps", "errors", "hit_rate", "itl_p50_ms", "itl_p99_ms", "kind",
		"max_mean_load", "output_tok_per_s", "policy", "requests", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms"}, keys(r2))
	require.Equal(t, "exec", r2["kind"])
	require.Equal(t, 1.0, r2["epps"])
	require.Equal(t, 0.4, r2["hit_rate"])
	require.Equal(t, "", r2["decision_source"]) // no histogram the bench knows
	require.Nil(t, r2["epp_requests"])
}

func TestHTMLReport(t *testing.T) {
	for _, sweep := range []bool{false, true} {
		r := sampleReport()
		if sweep {
			r.Sweep = &SweepInfo{Base: "precise", Front: paretoFront(r.Results)}
		}
		var buf bytes.Buffer
		require.NoError(t, r.WriteHTML(&buf))
		out := buf.String()
		require.True(t, strings.HasPrefix(out, "<!DOCTYPE html>"))
		require.Contains(t, out, "</html>")
		require.NotContains(t, out, "<script")
		require.Contains(t, out, "s&lt;&amp;&gt;") // escaped scenario
		require.Contains(t, out, "model time")
		svgs := regexp.MustCompile(`(?s)<svg .*?</svg>`).FindAllString(out, -1)
		want := 5 // TTFT vs QPS, tok/s vs QPS, hit rate vs bound, tok/s, load
		if sweep {
			want++
			require.Contains(t, out, "Sweep")
		}
		require.Len(t, svgs, want)
		for _, s := range svgs {
			// Each chart is well-formed XML.
			dec := xml.NewDecoder(strings.NewReader(s))
			for {
				_, err := dec.Token()
				if err == io.EOF {
					break
				}
				require.NoError(t, err)
			}
		}
		require.Contains(t, out, "bound 50.0%")
	}
}

func TestWriteTable(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, sampleReport().WriteTable(&buf))
	out := buf.String()
	require.Contains(t, out, "random")
	require.Contains(t, out, "precise")
	require.Regexp(t, `TTFT p90 ms \(model\)\s+100\.0\s+20\.0`, out)
	require.Regexp(t, `hit rate / bound\s+40\.0%\s+90\.0%`, out)
}

func TestLagWarning(t *testing.T) {
	f := rig.Options{Fleet: rig.FleetOptions{TimeScale: 4}}.WithDefaults().Fleet
	require.Empty(t, lagWarning(PolicyResult{ITLP50: 11}, f))
	require.Empty(t, lagWarning(PolicyResult{ITLP50: math.NaN()}, f))
	require.Contains(t, lagWarning(PolicyResult{ITLP50: 0.02}, f), "time scale 4")
	// A slower decode step moves the threshold with it.
	f.Timing.DecodeBase = new(105 * time.Millisecond)
	require.Contains(t, lagWarning(PolicyResult{ITLP50: 30}, f), "105.0 ms")
}

func TestCheck(t *testing.T) {
	r := sampleReport()
	got, err := r.Check("precise", 0.95, 1.15, true)
	require.NoError(t, err)
	byName := map[string]CheckResult{}
	for _, c := range got {
		byName[c.Name] = c
	}
	require.Len(t, got, 5)
	require.False(t, byName["hit rate >= 95% of bound"].OK) // 45% of 50% = 90%
	require.Equal(t, "45.0% of 50.0% = 90.0%", byName["hit rate >= 95% of bound"].Got)
	require.True(t, byName["max/mean load <= 1.15"].OK)
	require.True(t, byName["TTFT p90 below random"].OK)
	require.True(t, byName["output tok/s above random"].OK)
	got, err = r.Check("random", 0.3, 1.05, false)
	require.NoError(t, err)
	require.Len(t, got, 4)
	require.True(t, got[0].OK)
	require.False(t, got[1].OK)
	require.False(t, got[3].OK) // random is slower than precise
	_, err = r.Check("nope", 0.95, 1.15, false)
	require.Error(t, err)
}

func TestProgress(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf, 4)
	p.setLabel("precise")
	for i := 0; i < 4; i++ {
		p.tick()
	}
	p.finish()
	out := buf.String()
	require.Contains(t, out, "precise")
	require.Contains(t, out, "100% 4/4")
	require.True(t, strings.HasSuffix(out, "\n"))
	q := newProgress(nil, 0) // no terminal: draws nothing, never fails
	q.setLabel("x")
	q.tick()
	q.finish()
}

func TestAcrossStages(t *testing.T) {
	for _, c := range []struct {
		name       string
		stages     []StageResult
		ttft, tput float64
		n          int
	}{
		{"one stage has no summary", []StageResult{{QPS: 1, Requests: 10, TTFTP90ms: 5, OutputTokPS: 7}}, 0, 0, 0},
		{"p90s weighted by successes, tok/s plain",
			[]StageResult{{QPS: 1, Requests: 10, TTFTP90ms: 100, OutputTokPS: 10}, {QPS: 2, Requests: 40, Errors: 10, TTFTP90ms: 400, OutputTokPS: 30}},
			(10*100 + 30*400) / 40.0, 20, 2},
		{"warm-up left out",
			[]StageResult{{QPS: 5, Warmup: true, Requests: 99, TTFTP90ms: 1e6, OutputTokPS: 1e6}, {QPS: 1, Requests: 1, TTFTP90ms: 3, OutputTokPS: 4}, {QPS: 2, Requests: 3, TTFTP90ms: 7, OutputTokPS: 8}},
			(3 + 3*7) / 4.0, 6, 2},
		{"a stage without a success left out",
			[]StageResult{{QPS: 1, Requests: 2, Errors: 2, TTFTP90ms: math.NaN()}, {QPS: 2, Requests: 5, TTFTP90ms: 9, OutputTokPS: 2}},
			9, 2, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := acrossStages(c.stages)
			require.InDelta(t, c.ttft, s.TTFTP90ms, 1e-9)
			require.InDelta(t, c.tput, s.OutputTokPS, 1e-9)
			require.Equal(t, c.n, s.Stages)
		})
	}
}

// TestLLMD73Published checks the transcription of the published report:
// the mean of each router's stage tok/s is its summary's (the report's
// own rule, to the rounding of its table), and its stage p90s weighted by
// completed requests land near the summary's p90 (the report weighs by
// successes over measured stage durations, which it does not print),
// nearer than their plain mean.
func TestLLMD73Published(t *testing.T) {
	pub := LLMD73Published(0.1)
	require.Len(t, pub.Policies, 4)
	for _, pp := range pub.Policies {
		t.Run(pp.Name, func(t *testing.T) {
			require.Len(t, pp.Stages, len(llmd73QPS)-1)
			for i, st := range pp.Stages {
				require.Equal(t, llmd73QPS[i+1], st.QPS)
			}
			s := acrossStages(pp.Stages)
			require.InDelta(t, pp.Summary.OutputTokPS, s.OutputTokPS, 0.05)
			require.InEpsilon(t, pp.Summary.TTFTP90ms, s.TTFTP90ms, 0.12)
			var plain float64
			for _, st := range pp.Stages {
				plain += st.TTFTP90ms / float64(len(pp.Stages))
			}
			require.Less(t, math.Abs(s.TTFTP90ms-pp.Summary.TTFTP90ms), math.Abs(plain-pp.Summary.TTFTP90ms)+0.01*pp.Summary.TTFTP90ms)
		})
	}
}

func TestWriteTablePublished(t *testing.T) {
	rep := sampleReport()
	rep.Published = &Published{Source: "src", TokenScale: 0.5, Policies: []PublishedPolicy{
		{Policy: "random", Name: "pub-random", Stages: []StageResult{{QPS: 1, TTFTP90ms: 7000, OutputTokPS: 20}, {QPS: 3, TTFTP90ms: 9000, OutputTokPS: 40}},
			Summary: StageSummary{TTFTP90ms: 8000, OutputTokPS: 30}},
		{Policy: "precise", Name: "pub-precise", Stages: []StageResult{{QPS: 1, TTFTP90ms: 300, OutputTokPS: 50}, {QPS: 2, TTFTP90ms: 400, OutputTokPS: 60}},
			Summary: StageSummary{TTFTP90ms: 350, OutputTokPS: 60}}}}
	for i := range rep.Results {
		rep.Results[i].AcrossStages = acrossStages(rep.Results[i].Stages)
	}
	var buf bytes.Buffer
	require.NoError(t, rep.WriteTable(&buf))
	out := buf.String()
	require.Regexp(t, `published \(src; tok/s x 0\.5\)\s+pub-random\s+pub-precise`, out)
	require.Regexp(t, `QPS 1\.0: TTFT p90 / tok/s\s+7000 / 10\s+300 / 25`, out)
	// A stage the publication did not run at that rate reads "-".
	require.Regexp(t, `QPS 3\.0: TTFT p90 / tok/s\s+9000 / 20\s+-\s`, out)
	require.Regexp(t, `across stages: TTFT p90 / tok/s\s+8000 / 15\s+350 / 30`, out)
	// The run's tok/s across stages: random (25+50)/2, precise (45+90)/2.
	require.Contains(t, out, "output tok/s across stages over random's: precise 1.80 (published 2.00)")

	// No publication, or none beside these policies: neither block nor note.
	for _, p := range []*Published{nil, {Source: "src", TokenScale: 1, Policies: []PublishedPolicy{{Policy: "other", Name: "x"}}}} {
		rep.Published = p
		buf.Reset()
		require.NoError(t, rep.WriteTable(&buf))
		require.NotContains(t, buf.String(), "published")
	}
}

// TestSessionFigures: goodput counts only calls within the TTFT
// objective, a session is complete when all its calls were answered, a
// 429 that ends it marks it refused, and a retried 429 only counts as a
// retry.
func TestSessionFigures(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ok := func(s, turn int, start, ttft, e2e time.Duration, out int) *rig.Result {
		return &rig.Result{Session: s, Turn: turn, Start: t0.Add(start), TTFT: ttft, E2E: e2e, Output: out, Status: 200}
	}
	res := []*rig.Result{
		ok(0, 0, 0, 100*time.Millisecond, time.Second, 10),
		ok(0, 1, 5*time.Second, 3*time.Second, 4*time.Second, 20), // late: not goodput
		ok(1, 0, time.Second, 200*time.Millisecond, time.Second, 30),
		{Session: 2, Turn: 0, Start: t0, Status: 429, Err: errors.New("status 429")},
		ok(3, 0, 0, 100*time.Millisecond, time.Second, 5), // one of two calls: not complete
		{Session: 1, Turn: 0, Start: t0, Status: 429, Err: errors.New("status 429"), Retried: true},
		{Session: 1, Turn: 0, Start: t0, Status: 429, Err: errors.New("status 429"), Retried: true},
	}
	f := sessionFigures(res, map[int]int{0: 2, 1: 1, 2: 3, 3: 2}, 10*time.Second, 1)
	require.Equal(t, 4, f.Sessions)
	require.Equal(t, 2, f.Completed)
	require.InDelta(t, 12, f.CompletedPerMin, 1e-9) // 2 in 10 s
	require.Equal(t, 1, f.Refused)
	require.Equal(t, 2, f.Retries)
	require.InDelta(t, 4.5, f.GoodputTokPS, 1e-9) // (10+30+5)/10s
	require.InDelta(t, 5, f.CompletionP50, 1e-9)  // sessions of 9 s and 1 s
	require.InDelta(t, 8.2, f.CompletionP90, 1e-9)
	require.True(t, math.IsNaN(f.Moves))
	// Model time: latencies scale, so the late call counts at scale 0.5.
	f = sessionFigures(res, map[int]int{0: 2, 1: 1, 2: 3, 3: 2}, 10*time.Second, 0.5)
	require.InDelta(t, 6.5, f.GoodputTokPS, 1e-9)
}
