package proof

import (
	"bytes"
	"context"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/omnious/provider-node/bench/internal/stat"
	"github.com/omnious/provider-node/bench/rig"
	"github.com/omnious/provider-node/capacity"
)

func TestCapacityEdge(t *testing.T) {
	r := &capacityRun{o: Options{Objectives: capacity.Objectives{TTFT: 2 * time.Second, ITL: 50 * time.Millisecond, Quantile: 0.95}}}
	step := func(qps, itl float64) Step {
		return Step{QPS: qps, Requests: 100, TTFTP95ms: 100, ITLP95ms: itl, OutputTokPS: qps * 50, Concurrency: qps, Within: itl <= 50}
	}
	for _, tc := range []struct {
		name  string
		steps []Step
		qps   float64
	}{
		{"crossing between two steps", []Step{step(10, 30), step(20, 40), step(30, 60)}, 25},
		// 52.5 at 32 and 45 at 34 pool to 48.75; the crossing moves past 34.
		{"a noisy step is pooled with its neighbour", []Step{step(16, 30), step(32, 52.5), step(34, 45), step(36, 60)},
			34 + 2*(50-48.75)/(60-48.75)},
		{"never crosses: the highest step", []Step{step(10, 30), step(20, 40)}, 20},
		{"an errored step counts as past the edge", []Step{step(10, 30), {QPS: 20, Requests: 10, Errors: 1}}, 10},
		// 30 and 80 at 20 merge to 55: the rate that held once by chance
		// is past the edge, not on it.
		{"a rate measured twice is one point", []Step{step(10, 30), step(20, 30), step(40, 90), step(20, 80)},
			10 + 10*(50-30)/(55-30.0)},
		// Three at 20: the median, 40, holds.
		{"a rate measured three times reads its median", []Step{step(10, 30), step(20, 30), step(20, 80), step(40, 90), step(20, 40)},
			20 + 20*(50-40)/(90-40.0)},
		// Merged to 45 at 20, the crossing is between 20 and 40.
		{"a repeat that holds keeps the rate", []Step{step(10, 30), step(20, 40), step(40, 90), step(20, 50)},
			20 + 20*(50-45)/(90-45.0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r.rep = &Report{Ladder: tc.steps}
			got := r.edge()
			require.InDelta(t, tc.qps, got.QPS, 1e-9)
			// The confirming step goes to the highest rate held, which
			// the edge is at or above.
			held, ok := r.heldBelow(r.rates(), math.Inf(1))
			require.True(t, ok)
			require.LessOrEqual(t, held.QPS, got.QPS)
			require.True(t, got.Within)
			// Rates follow the arrival rate from the step below the edge.
			require.InDelta(t, 50*tc.qps, got.OutputTokPS, 1e-6)
		})
	}
}

// The ladder on a fleet that holds below 21 QPS, but whose first step at
// 16 breaks and whose first at 22 holds, by chance.
func TestCapacityLadder(t *testing.T) {
	for _, tc := range []struct {
		name    string
		confirm int
		rates   []float64
		edge    [2]float64
	}{
		{"a rate's majority decides", 2,
			[]float64{4, 8, 16, 16, 16, 32, 32, 24, 24, 20, 22, 23, 23, 22, 22, 21, 21, 20}, [2]float64{20, 21}},
		{"every rate measured once", 0, []float64{4, 8, 16, 12, 14, 15, 15.5}, [2]float64{15.5, 16}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := map[float64]int{}
			r := &capacityRun{rep: &Report{}, o: Options{Confirm: new(tc.confirm)}.WithDefaults(),
				probe: func(label string, qps float64) Step {
					seen[qps]++
					within := qps < 21
					if seen[qps] == 1 && (qps == 16 || qps == 22) {
						within = !within
					}
					itl := 100.0
					if within {
						itl = 40
					}
					return Step{Label: label, QPS: qps, Requests: 100, TTFTP95ms: 100, ITLP95ms: itl, OutputTokPS: 50 * qps, Within: within}
				}}
			r.o.StartQPS = 4
			require.NoError(t, r.ladder(context.Background()))
			var rates []float64
			for _, st := range r.rep.Ladder {
				rates = append(rates, st.QPS)
			}
			require.Equal(t, tc.rates, rates)
			require.GreaterOrEqual(t, r.rep.True.QPS, tc.edge[0])
			require.Less(t, r.rep.True.QPS, tc.edge[1])
		})
	}
}

// The streams ladder on a fleet whose p95 ITL is 1 ms a stream: the
// objective (50 ms) breaks past 50 streams. With Confirm, the first step
// at 30 breaks and the first at 68 holds, by chance (at 40 ms): a number
// that held once is measured again before it is the edge.
func TestCapacityStreamsLadder(t *testing.T) {
	for _, tc := range []struct {
		name    string
		confirm int
		start   float64
		steps   []int
	}{
		{"up from a hold", 0, 20, []int{20, 30, 45, 68, 56, 50, 53}},
		{"down from a break", 0, 90, []int{90, 60, 40, 50, 55, 52}},
		{"a number's majority decides", 2, 20,
			[]int{20, 30, 30, 30, 45, 68, 102, 102, 85, 85, 76, 76, 72, 72, 68, 68, 56, 56, 45}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := map[int]int{}
			r := &capacityRun{o: Options{Objectives: capacity.Objectives{TTFT: 2 * time.Second, ITL: 50 * time.Millisecond,
				Quantile: 0.95}, Confirm: new(tc.confirm)}, rep: &Report{True: Step{Concurrency: tc.start}},
				streamProbe: func(n int) Step {
					seen[n]++
					st := Step{Streams: n, Requests: 100, TTFTP95ms: 100, ITLP95ms: float64(n), Within: n <= 50}
					if tc.confirm > 0 && seen[n] == 1 {
						switch n {
						case 30:
							st.ITLP95ms, st.Within = 60, false
						case 68:
							st.ITLP95ms, st.Within = 40, true
						}
					}
					return st
				}}
			require.NoError(t, r.streamsLadder(context.Background()))
			var steps []int
			for _, st := range r.rep.StreamsLadder {
				steps = append(steps, st.Streams)
			}
			require.Equal(t, tc.steps, steps)
			require.InDelta(t, 50, r.rep.TrueStreams, 1e-9, "read where the fit crosses the objective")
		})
	}
	r := &capacityRun{o: Options{Confirm: new(2)}, rep: &Report{True: Step{Concurrency: 3}},
		streamProbe: func(n int) Step { return Step{Streams: n, Requests: 1, Errors: 1} }}
	require.ErrorContains(t, r.streamsLadder(context.Background()), "one stream")
}

// A check is measured until two of its steps agree, once without Confirm.
func TestCapacityCheck(t *testing.T) {
	for _, tc := range []struct {
		name     string
		confirm  int
		outcomes []bool
		steps    int
	}{
		{"held twice", 2, []bool{true, true, false}, 2},
		{"broke twice", 2, []bool{false, false, true}, 2},
		{"disagree, then held", 2, []bool{true, false, true}, 3},
		{"disagree, then broke", 2, []bool{false, true, false}, 3},
		{"once without confirm", 0, []bool{false, true, true}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &capacityRun{o: Options{Confirm: new(tc.confirm)}, rep: &Report{}}
			i := 0
			r.check(context.Background(), func() Step {
				i++
				return Step{Label: "1.00x idle quote", Within: tc.outcomes[i-1]}
			})
			require.Len(t, r.rep.Checks, tc.steps)
			for k, st := range r.rep.Checks {
				require.Equal(t, tc.outcomes[k], st.Within)
			}
		})
	}
}

func TestCapacityVerdicts(t *testing.T) {
	r := &Report{Replicas: 4, Objectives: capacity.ObjectivesJSON{TTFTSeconds: 2, ITLSeconds: 0.05, Quantile: 0.95},
		True: Step{QPS: 30, OutputTokPS: 1500, Concurrency: 30}, TrueStreams: 40,
		HalfLoad: Step{OutputTokPS: 900, Within: true}, HalfLoadAtQuote: 750,
		Quotes: []Quote{{Label: "idle", TokensPerS: 1425, Concurrency: 38}, {Label: "half loaded", TokensPerS: 700},
			{Label: "idle, before the loss", TokensPerS: 1400}, {Label: "one replica lost", TokensPerS: 1050}},
		Checks: []Step{{Label: "0.50x idle quote", Within: true}, {Label: "1.00x idle quote", Within: true},
			{Label: "1.25x idle quote", Within: false}, {Label: "half load + 1.00x quote", Within: true},
			{Label: "1.00x quoted concurrency", Streams: 38, Within: true}, {Label: "1.25x quoted concurrency", Streams: 48, Within: false}}}
	v := r.Verdicts()
	require.InDelta(t, 0.95, v.IdleTokens, 1e-9)
	require.InDelta(t, 0.95, v.IdleConcurrency, 1e-9, "over the streams held, not the arrivals' in flight")
	require.True(t, v.AtQuote)
	require.True(t, v.Over)
	require.True(t, v.ConcurrencyOver)
	require.InDelta(t, 700.0/750, v.HalfTokens, 1e-9, "the load the quote read, not the step's mean")
	require.True(t, v.HalfAtQuote)
	require.InDelta(t, 1.0, v.LostTokens, 1e-9)
	require.True(t, math.IsNaN((&Report{}).Verdicts().IdleTokens))
	// The quote holds only if both its rate and its streams do.
	r.Checks[4].Within = false
	require.False(t, r.Verdicts().AtQuote)
	r.Checks[4].Within = true
	// A check repeated is judged by the majority of its steps; as many
	// of each count against the quote, whichever way it is judged.
	steps := func(label string, within ...bool) (out []Step) {
		for _, w := range within {
			out = append(out, Step{Label: label, Within: w})
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		at, over []bool
		atQuote  bool
		broke    bool
	}{
		{"held twice, broke twice", []bool{true, true}, []bool{false, false}, true, true},
		{"broke once, then held twice", []bool{false, true, true}, []bool{true, false, false}, true, true},
		{"broke twice", []bool{false, true, false}, []bool{false, true, true}, false, false},
		{"one each", []bool{true, false}, []bool{false, true}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := *r
			m.Checks = append(steps("1.00x idle quote", tc.at...), steps("1.25x idle quote", tc.over...)...)
			v := m.Verdicts()
			require.Equal(t, tc.atQuote, v.AtQuote)
			require.Equal(t, tc.broke, v.Over)
			require.False(t, v.ConcurrencyOver, "no streams checked")
		})
	}

	var b bytes.Buffer
	require.NoError(t, r.WriteHTML(&b))
	require.Contains(t, b.String(), "<svg")
	b.Reset()
	require.NoError(t, r.WriteTable(&b))
	require.Contains(t, b.String(), "idle quote / true capacity, tok/s")
}

// Every step of a trace's ladder carries the whole trace's mix, in every
// part of the step: a trace whose answers grow along it gives each step,
// and each tenth of it, about the trace's mean answer, whatever its rate.
// Each walk takes the trace's records in order, from one step to the
// next, and no record comes again before the walks have been through the
// trace.
func TestCapacityTraceStepDrawsTheWholeTrace(t *testing.T) {
	trace := make([]rig.TraceRecord, 1000)
	mean := 0.0
	for i := range trace {
		trace[i] = rig.TraceRecord{Timestamp: int64(i), InputLength: 10, OutputLength: i + 1, HashIDs: []int64{int64(i)}}
		mean += float64(i+1) / float64(len(trace))
	}
	r := &capacityRun{trace: trace}
	o := rig.Options{Fleet: rig.FleetOptions{TimeScale: 1}}
	seen := map[int]bool{}
	before := 0    // rounds the steps before took
	var last []int // the last record of each walk
	for step, qps := range []float64{2, 4, 32} {
		o.Seed = int64(step)
		w := r.traceStep(o, qps, 100*time.Second)
		n := len(w.Requests)
		require.InDelta(t, qps*100, float64(n), 5*math.Sqrt(qps*100))
		for i, req := range w.Requests {
			switch {
			case i >= traceStreams:
				require.Equal(t, w.Requests[i-traceStreams].MaxTokens%len(trace)+1, req.MaxTokens, "request %d: the next record of its walk", i)
			case last != nil:
				require.Equal(t, last[i]%len(trace)+1, req.MaxTokens, "step %d, request %d: its walk goes on", step, i)
			}
			if before+i/traceStreams < len(trace)/traceStreams {
				require.False(t, seen[req.MaxTokens], "step %d, request %d: record %d again", step, i, req.MaxTokens)
				seen[req.MaxTokens] = true
			}
		}
		// Each walk takes the step's rounds, the last one whole: a step
		// that ends within a round skips the rest of its records.
		rounds := (n + traceStreams - 1) / traceStreams
		before += rounds
		last = make([]int, traceStreams)
		for i := range last {
			last[i] = (w.Requests[i].MaxTokens-1+rounds-1)%len(trace) + 1
		}
		// A round (one record of each walk) over a trace whose answers
		// grow by one a record averages the trace's mean, off by at most
		// half the walks' spacing (50): so do the step's whole rounds and
		// every tenth of them.
		whole := n / traceStreams
		for k := range 11 {
			from, to := k*whole/10, (k+1)*whole/10
			if k == 10 {
				from, to = 0, whole
			}
			s := 0.0
			for _, req := range w.Requests[from*traceStreams : to*traceStreams] {
				s += float64(req.MaxTokens)
			}
			require.InDelta(t, mean, s/float64((to-from)*traceStreams), 50, "QPS %v, tenth %d (10: all)", qps, k)
		}
	}
}

// TestCapacityUnsentRounds: the records a closed step drew but did not send
// go back to the walks, so no record is sent twice before the walks have
// been through the trace, however little of what they draw the steps send;
// a step drawn meanwhile keeps its rounds.
func TestCapacityUnsentRounds(t *testing.T) {
	trace := make([]rig.TraceRecord, 1000) // 100 rounds a pass
	for i := range trace {
		trace[i] = rig.TraceRecord{InputLength: 10, OutputLength: i + 1, HashIDs: []int64{int64(i)}}
	}
	r := &capacityRun{trace: trace}
	o := rig.Options{Fleet: rig.FleetOptions{TimeScale: 1}}
	seen := map[int]bool{}
	sentRounds := int64(0)
	for step := range 8 {
		o.Seed = int64(step)
		from := r.traceRounds.Load()
		w := r.traceStep(o, 1.6, 100*time.Second) // about 16 rounds
		to := r.traceRounds.Load()
		sent := int64(len(w.Requests)) / 3 // a closed loop sends some
		if step == 5 {
			sent = 0
		}
		for _, req := range w.Requests[:sent] {
			require.False(t, seen[req.MaxTokens], "step %d: record %d sent again within a pass", step, req.MaxTokens)
			seen[req.MaxTokens] = true
		}
		r.unsentRounds(from, to, sent)
		sentRounds += (sent + traceStreams - 1) / traceStreams
		require.Equal(t, sentRounds, r.traceRounds.Load(), "step %d: the walks go on where the sending stopped", step)
	}
	require.Greater(t, len(seen), 200)

	// Another step drew after the closed one: nothing is given back.
	from := r.traceRounds.Load()
	w := r.traceStep(o, 1.6, 100*time.Second)
	to := r.traceRounds.Load()
	r.traceStep(o, 1.6, 100*time.Second)
	after := r.traceRounds.Load()
	r.unsentRounds(from, to, int64(len(w.Requests))/3)
	require.Equal(t, after, r.traceRounds.Load())

	// Without a trace there are no walks.
	r = &capacityRun{}
	r.unsentRounds(0, 10, 1)
	require.Zero(t, r.traceRounds.Load())
}

// TestOutputRate: a request's tokens count where they streamed, its usage
// spread over its chunks; failed requests count nothing.
func TestOutputRate(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	// Chunks at 100, 200, ..., 1000 ms after t0.
	ten := &rig.Result{Start: t0, TTFT: ms(100), ITL: slices.Repeat([]time.Duration{ms(100)}, 9), Output: 10}
	// Two chunks of 5 tokens each (usage over chunks), at 300 and 800 ms.
	bundled := &rig.Result{Start: t0.Add(ms(200)), TTFT: ms(100), ITL: []time.Duration{ms(500)}, Output: 10}
	failed := &rig.Result{Start: t0, TTFT: ms(100), ITL: []time.Duration{ms(100)}, Output: 2, Err: errors.New("reset")}
	for _, tc := range []struct {
		name     string
		res      []*rig.Result
		from, to time.Duration
		want     float64
	}{
		{name: "whole", res: []*rig.Result{ten}, from: 0, to: ms(1001), want: 10 / 1.001},
		{name: "half open", res: []*rig.Result{ten}, from: ms(100), to: ms(600), want: 5 / 0.5},
		{name: "bundled chunks", res: []*rig.Result{bundled}, from: ms(250), to: ms(750), want: 5 / 0.5},
		{name: "both", res: []*rig.Result{ten, bundled}, from: 0, to: ms(2000), want: 20 / 2.0},
		{name: "failed", res: []*rig.Result{failed}, from: 0, to: ms(2000), want: 0},
		{name: "empty window", res: []*rig.Result{ten}, from: ms(500), to: ms(500), want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.InDelta(t, tc.want, outputRate(tc.res, t0.Add(tc.from), t0.Add(tc.to)), 1e-9)
		})
	}
}

// TestMeasureGapsInTheStep: a step counts the requests begun after its
// first fifth, and every inter-token gap that ended between then and its
// end, whichever request's; what streamed after its end, as the fleet
// drained, does not count.
func TestMeasureGapsInTheStep(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := func(x float64) time.Duration { return time.Duration(x * float64(time.Second)) }
	req := func(start, ttft float64, gaps ...float64) *rig.Result {
		x := &rig.Result{Start: t0.Add(s(start)), TTFT: s(ttft), Output: len(gaps) + 1}
		for _, g := range gaps {
			x.ITL = append(x.ITL, s(g))
		}
		return x
	}
	failed := req(5, 0.1, 0.1)
	failed.Err = errors.New("reset")
	// A 10 s step measures from 2 s on.
	res := []*rig.Result{
		req(0, 1, 0.5, 1.5, 8),       // chunks at 1, 1.5 (before), 3 (in), 11 (after the end)
		req(3, 0.25, 0.05, 0.1, 6.5), // chunks at 3.25, 3.3, 3.4 (in), 9.9 (in)
		req(9, 0.5, 0.2, 3),          // chunks at 9.5, 9.7 (in), 12.7 (after)
		failed,
		{}, // never sent
	}
	r := &capacityRun{o: Options{Objectives: capacity.Objectives{TTFT: s(2), ITL: s(2), Quantile: 0.95}}, log: zap.NewNop()}
	st := r.measure("step", res, t0, s(10), nil)
	require.Equal(t, 3, st.Requests, "begun in the step: two served, one failed")
	require.Equal(t, 1, st.Errors)
	want := func(gaps ...float64) float64 {
		ds := make([]time.Duration, len(gaps))
		for i, g := range gaps {
			ds[i] = s(g)
		}
		return stat.Percentile(stat.SortedMillis(ds, 1), 95)
	}
	require.InDelta(t, want(1.5, 0.05, 0.1, 6.5, 0.2), st.ITLP95ms, 1e-9)
	require.InDelta(t, want(0.25, 0.5), st.TTFTP95ms, 1e-9)
	require.False(t, st.Within, "a failed request breaks the step")

	st = r.measure("step", res[:3], t0, s(10), nil)
	require.Zero(t, st.Errors)
	require.False(t, st.Within, "the 6.5 s gap that ended in the step counts")
	st = r.measure("step", res[2:3], t0, s(10), nil)
	require.True(t, st.Within, "the 3 s gap that ended after the step does not")
}

// TestAlongside: a background's requests count with the step's while
// both ran, up to the step's end; never sent, or sent after, they do not.
func TestAlongside(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) *rig.Result { return &rig.Result{Start: t0.Add(time.Duration(s) * time.Second)} }
	step := []*rig.Result{at(10), at(15)}
	before, during, after, unsent := at(2), at(12), at(20), &rig.Result{}
	got := alongside(step, []*rig.Result{before, during, after, unsent}, t0.Add(20*time.Second))
	require.Equal(t, []*rig.Result{step[0], step[1], before, during}, got)
	require.Len(t, step, 2, "the step's own slice is left as it was")
}

// TestEngineMeans: loads are averaged over the polls in the window, the
// hit rate over the prompt tokens those polls saw; a window without a
// poll, or without prompt tokens, reads 0.
func TestEngineMeans(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	loads := []engineLoad{
		{at: at(0), running: 100, waiting: 100, prompt: 1000, hits: 0},
		{at: at(1), running: 4, waiting: 0, prompt: 3000, hits: 3000},
		{at: at(2), running: 6, waiting: 2, prompt: 1000, hits: 0},
		{at: at(3), running: 100, waiting: 100, prompt: 1000, hits: 1000},
		{at: at(5), running: 2},
	}
	for _, tc := range []struct {
		name                   string
		from, to               int
		running, waiting, hits float64
	}{
		{name: "half open", from: 1, to: 3, running: 5, waiting: 1, hits: 0.75},
		{name: "all", from: 0, to: 4, running: 52.5, waiting: 50.5, hits: 4000.0 / 6000},
		{name: "one poll", from: 1, to: 2, running: 4, hits: 1},
		{name: "no prompt", from: 5, to: 6, running: 2},
		{name: "no poll", from: 6, to: 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, w, h := engineMeans(loads, at(tc.from), at(tc.to))
			require.InDelta(t, tc.running, r, 1e-9)
			require.InDelta(t, tc.waiting, w, 1e-9)
			require.InDelta(t, tc.hits, h, 1e-9)
		})
	}
}

// A closed loop keeps its streams busy and never more than them: its
// requests' summed latency over the window is about the streams, and the
// engines never count more requests than there are streams.
func TestCapacityClosedStep(t *testing.T) {
	ctx := context.Background()
	o := Options{Base: smallOptions(t), StageDuration: 16 * time.Second}.WithDefaults()
	sp := o.Base.Workload.SharedPrefix
	f, err := rig.StartFleet(ctx, o.Base.Fleet, o.Base.Seed, sp.SystemPromptLen+sp.QuestionLen+sp.OutputLen, o.Base.Log)
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Stop()) }()
	target, err := rig.EPPLauncher(o.Base.Log, rig.ExternalOptions{})(ctx, "precise", f.Endpoints(), 1)
	require.NoError(t, err)
	defer func() { require.NoError(t, target.Close()) }()
	r := &capacityRun{o: o, log: o.Base.Log, rep: &Report{True: Step{QPS: 20, Concurrency: 4}}, f: f, t: target.(*rig.EPPTarget)}
	r.c = rig.NewClient(r.t.URL(), f.Endpoints()[0].Model)
	defer r.c.Close()

	const n = 3
	// One engine's count at one scrape never exceeds the streams: each
	// replica's, read at every snapshot while the step runs.
	pctx, stopPolls := context.WithCancel(ctx)
	most := make(chan int, 1)
	go func() {
		m := 0
		for pctx.Err() == nil {
			if snap, err := r.t.EPPs()[0].Capacity(pctx); err == nil {
				for _, md := range snap.Models {
					for _, rc := range md.ReplicaCapacity {
						m = max(m, rc.Running+rc.Waiting)
					}
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		most <- m
	}()
	st := r.closedStep(ctx, "closed", n)
	stopPolls()
	require.Equal(t, n, st.Streams)
	require.Zero(t, st.Errors)
	// A 4 s wall step: a loaded machine answers few requests in it, but
	// each stream sent again after its answer.
	require.GreaterOrEqual(t, st.Requests, 2*n)
	// The step's concurrency is the time in flight of the requests begun
	// in its window over the window: n streams busy throughout give n,
	// and no more than 2n while no request outlasts the window. A client
	// the machine starves between two requests gives less, so only the
	// bounds are the step's.
	require.Positive(t, st.Concurrency)
	require.LessOrEqual(t, st.Concurrency, 2.0*n)
	perReplica := <-most
	require.Positive(t, perReplica, "the engines were seen busy")
	require.LessOrEqual(t, perReplica, n, "one engine held more requests than the closed streams")
	// The step's figure sums each replica's last scrape, and the scrapes
	// are spread over the interval: a stream whose request ended on one
	// replica after its scrape and whose next began on another before
	// its scrape is counted on both. So the fleet's mean is bounded by
	// the streams once per replica, not once.
	require.LessOrEqual(t, st.Running+st.Waiting, float64(n*len(f.Endpoints())))
	require.Positive(t, st.Running+st.Waiting)
	require.InDelta(t, float64(st.Requests)/(0.8*o.StageDuration.Seconds()), st.QPS, 1e-9)
}

// smallOptions is a fleet and traffic small enough for a test, logged at
// info: a request's debug lines would bury a failing proof's assertion in
// CI's cut of the output.
func smallOptions(t *testing.T) rig.Options {
	return rig.Options{Scenario: "e2e", Seed: 3, Log: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)),
		Fleet: rig.FleetOptions{Replicas: 2, TimeScale: 4, NumGPUBlocks: 400},
		Workload: rig.WorkloadOptions{Kind: rig.WorkloadSharedPrefix, SharedPrefix: rig.SharedPrefixOptions{
			NumGroups: 4, PromptsPerGroup: 2, SystemPromptLen: 300, QuestionLen: 40, OutputLen: 8,
			QPS: []float64{10, 20}, StageDuration: 2 * time.Second}}}
}

// TestOptionsObjectives: unset objectives take capacity.DefaultObjectives,
// and a negative one is refused.
func TestOptionsValidate(t *testing.T) {
	require.Equal(t, capacity.DefaultObjectives, Options{}.WithDefaults().Objectives)
	require.NoError(t, Options{}.WithDefaults().Validate())
	tests := []struct {
		name    string
		o       Options
		wantErr string
	}{
		{"negative TTFT", Options{Objectives: capacity.Objectives{TTFT: -time.Second}}, "TTFT objective"},
		{"negative ITL", Options{Objectives: capacity.Objectives{ITL: -time.Millisecond}}, "ITL objective"},
		{"quantile of 1", Options{Objectives: capacity.Objectives{Quantile: 1}}, "quantile"},
		{"negative stage", Options{StageDuration: -time.Second}, "-stage -1s is negative; give a positive duration, or 0 for the default (40s)"},
		{"negative start rate", Options{StartQPS: -1}, "-start-qps -1 is negative"},
		{"negative refine", Options{Refine: -1}, "-refine -1 is negative"},
		{"negative confirm", Options{Confirm: new(-1)}, "-confirm -1 is negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o.WithDefaults()
			require.ErrorContains(t, o.Validate(), tc.wantErr)
			_, err := Run(context.Background(), o)
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}

// TestCapacityURLFleet runs the proof against replicas it did not start:
// simulated engines on 127.0.0.1 given as URLs. It calibrates, quotes the
// idle fleet and offers that quote, in real time, and names what it could
// not run: the ladders (QuoteChecksOnly) and the lost replica, which it
// does not stop. Decode steps slow with the batch (40 ms per request)
// against an ITL objective of 150 ms: one stream per replica (about 50 ms)
// holds with room for a loaded machine, and calibration breaks the
// objective within a few levels (at four per replica, about 170 ms).
func TestCapacityURLFleet(t *testing.T) {
	ctx := context.Background()
	sims := rig.Options{Fleet: rig.FleetOptions{Replicas: 2, NumGPUBlocks: 400}}.WithDefaults()
	sims.Fleet.Timing.DecodePerSeq = new(40 * time.Millisecond)
	f, err := rig.StartFleet(ctx, sims.Fleet, 1, 1024, zap.NewNop())
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Stop()) }()
	var urls []string
	for _, ep := range f.Endpoints() {
		urls = append(urls, "http://"+ep.Addr)
	}

	base := smallOptions(t)
	base.Fleet = rig.FleetOptions{Mode: rig.FleetURLs, URLs: urls}
	rep, err := Run(ctx, Options{Base: base, Objectives: capacity.Objectives{ITL: 150 * time.Millisecond},
		StageDuration: 5 * time.Second, Confirm: new(0), QuoteChecksOnly: true})
	require.NoError(t, err)

	require.Equal(t, 2, rep.Replicas)
	require.NotNil(t, rep.Calibration)
	require.Empty(t, rep.Ladder)
	require.Empty(t, rep.StreamsLadder)
	var quotes []string
	for _, q := range rep.Quotes {
		quotes = append(quotes, q.Label)
	}
	require.Equal(t, []string{"idle, after calibration", "idle"}, quotes)
	idle := rep.Quotes[1]
	require.Greater(t, idle.TokensPerS, 0.0)
	var checks []string
	for _, c := range rep.Checks {
		checks = append(checks, c.Label)
		require.Greater(t, c.Requests, 0, c.Label)
		require.Zero(t, c.Errors, c.Label)
		// Real time: the replicas' decode step is at least 10.5 ms of
		// wall time, and the proof reports it as such.
		require.GreaterOrEqual(t, c.ITLP95ms, 10.0, c.Label)
	}
	want := []string{"0.50x idle quote", "1.00x idle quote", "1.25x idle quote"}
	if math.Round(idle.Concurrency) > 0 {
		want = append(want, "1.00x quoted concurrency", "1.25x quoted concurrency")
	}
	require.Equal(t, want, checks)
	require.Len(t, rep.Skipped, 2)
	require.Contains(t, rep.Skipped[0], "-quote-checks-only")
	require.Contains(t, rep.Skipped[1], "lost-replica check")

	var out bytes.Buffer
	require.NoError(t, rep.WriteTable(&out))
	require.Contains(t, out.String(), "skipped: lost-replica check: the replicas are external URLs")
	require.NotContains(t, out.String(), "true capacity, streams")
}
