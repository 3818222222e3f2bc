package compare

import (
	"math"
	"sort"
	"time"

	"github.com/omnious/provider-node/bench/internal/stat"
	"github.com/omnious/provider-node/bench/rig"
	"github.com/omnious/provider-node/capacity"
)

// StageResult is one QPS-ladder stage of one policy.
type StageResult struct {
	QPS          float64 `json:"qps"`
	Warmup       bool    `json:"warmup,omitempty"`
	Requests     int     `json:"requests"`
	Errors       int     `json:"errors"`
	TTFTP50ms    float64 `json:"ttft_p50_ms"`
	TTFTP90ms    float64 `json:"ttft_p90_ms"`
	OutputTokPS  float64 `json:"output_tok_per_s"`
	CachedTokens float64 `json:"cached_share"` // usage cached_tokens / prompt_tokens
}

// PolicyResult is every figure of one policy. Latencies are in model time
// for simulated fleets (wall time * time scale).
type PolicyResult struct {
	Policy string
	// Kind is how the policy ran: KindPolicy, KindConfig, KindExec or
	// KindAddr.
	Kind string
	// EPP is an external EPP's run (exec:, addr:); nil otherwise.
	EPP *rig.EPPInfo
	// EPPs is how many EPPs served it side by side (0: none, the direct
	// proxy).
	EPPs     int
	Requests int
	Errors   int
	// FirstError is an example error message, for the report.
	FirstError string
	// Warning says why the figures may be wrong (a simulation that fell
	// behind real time).
	Warning                   string
	TTFTP50, TTFTP90, TTFTP99 float64 // ms
	ITLP50, ITLP99            float64 // ms
	E2EP50, E2EP90, E2EP99    float64 // ms
	OutputTokPS               float64
	// HitRate is the replicas' own prefix-cache hits / queries over the
	// run; NaN when the replicas expose no such counters.
	HitRate float64
	// UsageCachedShare is sum(cached_tokens) / sum(prompt_tokens) from the
	// responses' usage.
	UsageCachedShare float64
	// LoadRequests, LoadPromptTokens and LoadHitRate are per replica, from
	// its counters (LoadHitRate NaN where it has no prefix-cache counters
	// or no queries).
	LoadRequests, LoadPromptTokens, LoadHitRate []float64
	// MaxMeanLoad is max/mean of LoadRequests.
	MaxMeanLoad, MaxMeanPromptLoad float64
	// DecisionP50us and DecisionP99us are the EPP's decision latencies, timed
	// by the EPP in process at each pick, or read from an external EPP's
	// histogram (EPP.DecisionHistogram); NaN when unknown.
	DecisionP50us, DecisionP99us float64
	Stages                       []StageResult
	// AcrossStages is the summary across a ladder's stages the way llm-d
	// publishes one (its benchmark report's summary across QPS): each
	// stage's TTFT p90 weighted by the stage's successful requests, and
	// the mean of the stages' output tok/s. Zero when the workload has
	// fewer than two stages.
	AcrossStages StageSummary
	// Duration is the run's model-time length.
	Duration time.Duration
	// Sessions are an agent workload's figures; nil for other workloads.
	Sessions *SessionFigures
}

// GoodputTTFT is the time-to-first-token objective a call must meet for
// its output to count as goodput: the capacity model's default TTFT
// objective (model time).
var GoodputTTFT = capacity.DefaultObjectives.TTFT

// SessionFigures are an agent workload's per-policy figures.
type SessionFigures struct {
	// GoodputTokPS is the output tokens per model second of calls whose
	// TTFT met GoodputTTFT, over the run's duration.
	GoodputTokPS float64
	// Sessions is how many sessions started, Completed how many got every
	// call answered, Refused how many ended on a 429 (session admission),
	// Retries how many refused calls closed-loop agents sent again.
	Sessions, Completed, Refused, Retries int
	// CompletedPerMin is completed sessions per model minute of the run.
	CompletedPerMin float64
	// CompletionP50 and CompletionP90 are completed sessions' times from
	// the first call's send to the last call's end, seconds (model time).
	CompletionP50, CompletionP90 float64
	// Moves is what the EPPs' omnious_epp_session_moves_total grew by;
	// AdmittedRoom and AdmittedSpare what omnious_epp_sessions_admitted_total
	// did, by reason room (within the KV budget) and spare_compute (past
	// it): the budget bound for the spare_compute ones. NaN when unknown
	// (another EPP).
	Moves, AdmittedRoom, AdmittedSpare float64
}

// sessionFigures summarises an agent workload's results: calls are
// grouped by Result.Session, and a session is complete when its calls
// number calls[session] and none failed.
func sessionFigures(res []*rig.Result, calls map[int]int, duration time.Duration, scale float64) *SessionFigures {
	f := &SessionFigures{Moves: math.NaN(), AdmittedRoom: math.NaN(), AdmittedSpare: math.NaN(), CompletionP50: math.NaN(), CompletionP90: math.NaN()}
	type acc struct {
		n          int
		failed     bool
		refused    bool
		start, end time.Time
	}
	by := map[int]*acc{}
	var good int64
	for _, r := range res {
		a := by[r.Session]
		if a == nil {
			a = &acc{}
			by[r.Session] = a
		}
		if r.Retried {
			f.Retries++
			continue
		}
		if r.Status == 429 {
			a.refused = true
		}
		if r.Err != nil {
			a.failed = true
			continue
		}
		a.n++
		if a.start.IsZero() || r.Start.Before(a.start) {
			a.start = r.Start
		}
		if e := r.Start.Add(r.E2E); e.After(a.end) {
			a.end = e
		}
		if time.Duration(float64(r.TTFT)*scale) <= GoodputTTFT {
			good += int64(r.Output)
		}
	}
	var done []float64
	for s, a := range by {
		f.Sessions++
		if a.refused {
			f.Refused++
		}
		if !a.failed && a.n == calls[s] {
			f.Completed++
			done = append(done, a.end.Sub(a.start).Seconds()*scale)
		}
	}
	sort.Float64s(done)
	f.CompletionP50, f.CompletionP90 = stat.Percentile(done, 50), stat.Percentile(done, 90)
	if duration > 0 {
		f.GoodputTokPS = float64(good) / duration.Seconds()
		f.CompletedPerMin = float64(f.Completed) / duration.Minutes()
	}
	return f
}

// StageSummary is a ladder's summary across stages.
type StageSummary struct {
	TTFTP90ms   float64 `json:"ttft_p90_ms"`
	OutputTokPS float64 `json:"output_tok_per_s"`
	Stages      int     `json:"stages"`
}

// acrossStages summarises the non-warm-up stages that had a successful
// request as llm-d's benchmark report summarises an inference-perf ladder
// (`_build_summary_across_qps` in its analysis script): the stages' TTFT
// p90s weighted by their successful requests, so a stage of 1,500
// requests counts 25 times one of 60, and the plain mean of the stages'
// output tok/s (inference-perf's per-stage figure). A plain mean of the
// p90s read the published run's random as 77.7 s where the report says
// 92.6 s.
func acrossStages(stages []StageResult) StageSummary {
	var s StageSummary
	if len(stages) < 2 {
		return s
	}
	var ok float64
	for _, st := range stages {
		n := float64(st.Requests - st.Errors)
		if st.Warmup || n <= 0 || math.IsNaN(st.TTFTP90ms) {
			continue
		}
		s.TTFTP90ms += n * st.TTFTP90ms
		s.OutputTokPS += st.OutputTokPS
		ok += n
		s.Stages++
	}
	if s.Stages > 0 {
		s.TTFTP90ms /= ok
		s.OutputTokPS /= float64(s.Stages)
	}
	return s
}

// maxMean is max/mean of xs (NaN for an empty or all-zero load).
func maxMean(xs []float64) float64 {
	var sum, mx float64
	for _, x := range xs {
		sum += x
		mx = math.Max(mx, x)
	}
	if len(xs) == 0 || sum == 0 {
		return math.NaN()
	}
	return mx / (sum / float64(len(xs)))
}

// summarise turns one policy's results and counter deltas into figures.
func summarise(policy string, w *rig.Workload, res []*rig.Result, delta []rig.Counters, decisions []time.Duration, scale float64) PolicyResult {
	pr := PolicyResult{Policy: policy, Requests: len(res), HitRate: math.NaN()}
	var ttft, itl, e2e []time.Duration
	var first, last time.Time
	var out, prompt, cached int64
	type acc struct {
		ttft           []time.Duration
		n, errs        int
		out            int64
		prompt, cached int64
		// start and end are the first send and the last end of the
		// stage's requests, failed ones included.
		start, end time.Time
	}
	stages := make([]acc, len(w.Stages))
	for _, r := range res {
		if r.Retried {
			// A refusal a closed-loop agent retried: counted in
			// SessionFigures.Retries, not as a request or an error.
			pr.Requests--
			continue
		}
		st := &stages[min(max(r.Stage, 0), len(stages)-1)]
		st.n++
		if first.IsZero() || (!r.Start.IsZero() && r.Start.Before(first)) {
			first = r.Start
		}
		if !r.Start.IsZero() {
			if st.start.IsZero() || r.Start.Before(st.start) {
				st.start = r.Start
			}
			if end := r.Start.Add(r.E2E); end.After(st.end) {
				st.end = end
			}
		}
		if r.Err != nil {
			pr.Errors++
			st.errs++
			if pr.FirstError == "" {
				pr.FirstError = r.Err.Error()
			}
			continue
		}
		if end := r.Start.Add(r.E2E); end.After(last) {
			last = end
		}
		ttft, e2e = append(ttft, r.TTFT), append(e2e, r.E2E)
		itl = append(itl, r.ITL...)
		out += int64(r.Output)
		prompt += int64(r.Prompt)
		cached += int64(r.Cached)
		st.ttft = append(st.ttft, r.TTFT)
		st.out += int64(r.Output)
		st.prompt += int64(r.Prompt)
		st.cached += int64(r.Cached)
	}
	t, i, e := stat.SortedMillis(ttft, scale), stat.SortedMillis(itl, scale), stat.SortedMillis(e2e, scale)
	pr.TTFTP50, pr.TTFTP90, pr.TTFTP99 = stat.Percentile(t, 50), stat.Percentile(t, 90), stat.Percentile(t, 99)
	pr.ITLP50, pr.ITLP99 = stat.Percentile(i, 50), stat.Percentile(i, 99)
	pr.E2EP50, pr.E2EP90, pr.E2EP99 = stat.Percentile(e, 50), stat.Percentile(e, 90), stat.Percentile(e, 99)
	if !first.IsZero() && last.After(first) {
		pr.Duration = time.Duration(float64(last.Sub(first)) * scale)
		pr.OutputTokPS = float64(out) / pr.Duration.Seconds()
	}
	if prompt > 0 {
		pr.UsageCachedShare = float64(cached) / float64(prompt)
	}
	var q, h float64
	ok := len(delta) > 0
	for _, d := range delta {
		ok = ok && d.OK
		q, h = q+d.Queries, h+d.Hits
		pr.LoadRequests = append(pr.LoadRequests, d.Requests)
		pr.LoadPromptTokens = append(pr.LoadPromptTokens, d.PromptTokens)
		hit := math.NaN()
		if d.OK && d.Queries > 0 {
			hit = d.Hits / d.Queries
		}
		pr.LoadHitRate = append(pr.LoadHitRate, hit)
	}
	if ok && q > 0 {
		pr.HitRate = h / q
	}
	pr.MaxMeanLoad, pr.MaxMeanPromptLoad = maxMean(pr.LoadRequests), maxMean(pr.LoadPromptTokens)
	dec := make([]float64, len(decisions))
	for k, d := range decisions {
		dec[k] = float64(d) / float64(time.Microsecond)
	}
	sort.Float64s(dec)
	pr.DecisionP50us, pr.DecisionP99us = stat.Percentile(dec, 50), stat.Percentile(dec, 99)
	for k, st := range stages {
		sr := StageResult{QPS: w.Stages[k].QPS, Warmup: w.Stages[k].Warmup, Requests: st.n, Errors: st.errs}
		ts := stat.SortedMillis(st.ttft, scale)
		sr.TTFTP50ms, sr.TTFTP90ms = stat.Percentile(ts, 50), stat.Percentile(ts, 90)
		// A stage's throughput is inference-perf's: the output of its
		// requests over the time from the first one's send to the last
		// one's end. A client at its concurrency bound sends a stage's
		// requests late; counted from the stage's scheduled start, the
		// wait for the backlog ahead of it would read as a slow fleet.
		if span := float64(st.end.Sub(st.start)) * scale; span > 0 {
			sr.OutputTokPS = float64(st.out) / (span / float64(time.Second))
		}
		if st.prompt > 0 {
			sr.CachedTokens = float64(st.cached) / float64(st.prompt)
		}
		pr.Stages = append(pr.Stages, sr)
	}
	pr.AcrossStages = acrossStages(pr.Stages)
	return pr
}

// chatBound estimates a chat workload's infinite-cache hit rate from one
// run's usage: turn k of a session can hit at most the previous turn's
// prompt and answer (capped at its own prompt), and the first turn of every
// session but the first the shared system prompt (sysTokens).
func chatBound(res []*rig.Result, sysTokens int) float64 {
	type key struct{ s, t int }
	byTurn := map[key]*rig.Result{}
	for _, r := range res {
		if r.Session >= 0 && r.Err == nil {
			byTurn[key{r.Session, r.Turn}] = r
		}
	}
	var hits, total int64
	firstSession := -1
	for k := range byTurn {
		if k.t == 0 && (firstSession < 0 || k.s < firstSession) {
			firstSession = k.s
		}
	}
	for k, r := range byTurn {
		total += int64(r.Prompt)
		if k.t == 0 {
			if k.s != firstSession {
				hits += int64(min(sysTokens, r.Prompt))
			}
			continue
		}
		if prev, ok := byTurn[key{k.s, k.t - 1}]; ok {
			hits += int64(min(prev.Prompt+prev.Output, r.Prompt))
		}
	}
	if total == 0 {
		return math.NaN()
	}
	return float64(hits) / float64(total)
}
