package compare

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/bench/internal/launch"
	"github.com/omnious/provider-node/bench/internal/stat"
	"github.com/omnious/provider-node/bench/rig"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/kvevents"
	"github.com/omnious/provider-node/engines/metrics"
	"github.com/omnious/provider-node/engines/sim/engine"
	"github.com/omnious/provider-node/engines/tokenizer"
	"github.com/omnious/provider-node/kvindex"
	"github.com/omnious/provider-node/scheduler"
)

// indexSink applies an engine's KV events to the index as they are
// published, as the EPP's ingestion does a moment later.
type indexSink struct{ st *kvindex.ReplicaState }

func (s indexSink) Publish(evs []kvevents.Event) {
	for i := range evs {
		s.st.Apply(&evs[i])
	}
}

// replayStage is one stage of a scheduler replay: latencies and, per
// decision, whether the request went to a replica holding its group's
// system prompt (home), to another while one held it (away, by cause) or
// where none held it (cold).
type replayStage struct {
	StageResult
	home, away, cold int
	why              map[string]int
	queued           []time.Duration
	// held counts the passes admission held the queue; kvTerm and
	// waitTerm sum the pool means of the saturation's KV and queue terms
	// at those passes.
	held             int
	kvTerm, waitTerm float64
	prompt, cached   int64
}

// Causes of an away decision, from the decision's reason and the signals
// the scheduler was given: the routing memory credited the primary with
// more than the index showed there (recall), speculative credit or a
// shorter indexed match won (credit), the imbalance guard dropped the
// holder's affinity (guard), every holder was above the KV ceiling
// (kv-filter), or the load scores outweighed the prefix score (score).
const (
	whyRecall   = "recall"
	whyCredit   = "credit"
	whyGuard    = "guard"
	whyKVFilter = "kv-filter"
	whyScore    = "score"
)

// replayScheduler replays the llmd-73 preset at scale k through the real
// scheduler on a fake clock: the bench's workload and client (concurrency,
// timeout, latencies from the send), 8 simulated engines stepped in model
// time at the preset's time scale, their KV events applied to the index as
// they are published and their /metrics text parsed and observed every
// scrape interval, admission as Headroom judges it (Admit's saturation
// formula; a request waits in order while its band is saturated, up to the
// queue TTL) and Pick's primary as the replica. The scheduler's clock is
// the wall clock the bench's EPP would see. tune edits the policy's config.
func replayScheduler(tb testing.TB, k float64, policy string, tune func(*scheduler.Config)) ([]replayStage, float64) {
	tb.Helper()
	o := LLMD73Options(k).WithDefaults()
	w, err := rig.BuildWorkload(o.Options)
	require.NoError(tb, err)
	f := o.Fleet
	cfg, err := launch.Tuning{Policy: policy, Seed: 7, ScrapeInterval: rig.ScrapeInterval, ScrapeTimeout: rig.ScrapeInterval}.Config()
	require.NoError(tb, err)
	if tune != nil {
		tune(&cfg)
	}
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	t0 := clock.Now()
	ix := kvindex.New(kvindex.Config{})
	sc := rig.SimConfig(f, o.Seed, w.MaxLen)
	s, err := scheduler.New(cfg, ix, nil, nil, scheduler.WithClock(clock.Now))
	require.NoError(tb, err)
	type replica struct {
		e    *engine.Engine
		addr string
		live int
		h    http.Handler
		sig  metrics.Signals // the last scrape's
		// requests, prompt and cached tokens served; kv sums the scrapes'
		// KV usage over scrapes; groups counts the groups placed here first.
		requests, groups, scrapes int
		prompt, cached            int64
		kv                        float64
	}
	reps := make([]*replica, f.Replicas)
	byAddr := map[string]int{}
	var targets []scheduler.Target
	for i := range reps {
		id := kvindex.Replica(i + 1)
		e, err := engine.New(sc.Engine, indexSink{kvindex.NewReplicaState(ix, id, sc.Model)}, nil, engine.WithClock(clock))
		require.NoError(tb, err)
		addr := fmt.Sprintf("127.0.0.1:%d", 20000+i) // a name only: nothing is sent
		reps[i] = &replica{e: e, addr: addr, h: promhttp.HandlerFor(e.Registry(), promhttp.HandlerOpts{})}
		byAddr[addr] = i
		targets = append(targets, scheduler.Target{Replica: id, Endpoint: endpoint.Endpoint{Addr: addr, Model: sc.Model,
			Engine: sc.Engine.Flavour, MetricsURL: "http://" + addr + "/metrics", KVEvents: "tcp://" + addr}})
	}
	s.SetEndpoints(targets)
	scrape := func(now time.Time) {
		for _, r := range reps {
			rec := httptest.NewRecorder()
			r.h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
			sm := &metrics.Sample{URL: "http://" + r.addr + "/metrics", At: now}
			require.NoError(tb, metrics.Parse(rec.Body.Bytes(), &sm.Signals))
			s.Observe(sm)
			r.sig = sm.Signals
			if now.Sub(t0) > 0 {
				r.kv += sm.Signals.KVUsage
				r.scrapes++
			}
		}
	}

	sp := o.Workload.SharedPrefix
	tok := tokenizer.NewStandIn()
	encoded := map[string][]uint32{}
	root := kvindex.RootKey(sc.Model, "", "")
	output := make([]uint32, sp.OutputLen)
	for i := range output {
		output[i] = uint32(i + 1)
	}
	type live struct {
		n        int // request index
		rep      int
		ch       <-chan engine.Update
		cancel   context.CancelFunc
		d        *scheduler.Decision
		sent     time.Time
		first    time.Time
		tokens   int
		prompt   int
		cachedTk int
	}
	type sent struct {
		n  int
		at time.Time
	}
	stages := make([]replayStage, len(w.Stages))
	for i := range stages {
		stages[i].QPS, stages[i].Warmup, stages[i].why = w.Stages[i].QPS, w.Stages[i].Warmup, map[string]int{}
	}
	ttfts := make([][]time.Duration, len(stages))
	firstSend := make([]time.Time, len(stages))
	lastEnd := make([]time.Time, len(stages))
	outTok := make([]int, len(stages))
	scale := f.TimeScale
	timeout := o.RequestTimeout
	var lives []*live
	var queue []sent // waiting in admission, in order
	next, inFlight := 0, 0
	nextScrape := t0
	var matches []kvindex.Match

	route := func(q sent, now time.Time) {
		rq := w.Requests[q.n]
		toks := encoded[rq.Text]
		if toks == nil {
			toks = tok.Encode(nil, rq.Text)
			encoded[rq.Text] = toks
		}
		st := &stages[rq.Stage]
		st.queued = append(st.queued, now.Sub(q.at))
		// Who holds the group's system prompt, as the engines' events say.
		keys := kvindex.AppendBlockKeys(nil, root, toks[:sp.SystemPromptLen], f.BlockSize)
		matches = ix.Match(keys, matches[:0])
		holders := map[int]bool{}
		for _, m := range matches {
			if m.ByTier[kvindex.TierGPU] == len(keys) {
				holders[int(m.Replica)-1] = true
			}
		}
		d, err := s.Pick(&scheduler.Request{ID: fmt.Sprint(q.n), Model: sc.Model, Tokens: toks, PromptText: []byte(rq.Text),
			Arrived: q.at}, nil)
		require.NoError(tb, err)
		p := byAddr[d.Endpoints[0].Addr]
		switch {
		case holders[p]:
			st.home++
		case len(holders) == 0:
			st.cold++
			reps[p].groups++
		default:
			st.away++
			st.why[awayCause(holders, d, cfg, func(i int) *metrics.Signals { return &reps[i].sig })]++
		}
		ctx, cancel := context.WithCancel(context.Background())
		ch, err := reps[p].e.Submit(ctx, &engine.Request{ID: fmt.Sprint(q.n), Prompt: toks, Output: output[:rq.MaxTokens]})
		require.NoError(tb, err)
		reps[p].live++
		lives = append(lives, &live{n: q.n, rep: p, ch: ch, cancel: cancel, d: d, sent: q.at})
	}
	finish := func(l *live, now time.Time, err error) {
		st := &stages[w.Requests[l.n].Stage]
		st.Requests++
		reps[l.rep].live--
		inFlight--
		lastEnd[w.Requests[l.n].Stage] = maxTime(lastEnd[w.Requests[l.n].Stage], now)
		info := scheduler.DoneInfo{Served: reps[l.rep].addr, Status: http.StatusOK, PromptTokens: l.prompt,
			CachedTokens: l.cachedTk, CompletionTokens: l.tokens}
		if err != nil {
			st.Errors++
			info = scheduler.DoneInfo{Err: err}
		} else {
			ttfts[w.Requests[l.n].Stage] = append(ttfts[w.Requests[l.n].Stage], l.first.Sub(l.sent))
			outTok[w.Requests[l.n].Stage] += l.tokens
			st.prompt += int64(l.prompt)
			st.cached += int64(l.cachedTk)
			r := reps[l.rep]
			r.requests++
			r.prompt += int64(l.prompt)
			r.cached += int64(l.cachedTk)
		}
		l.d.Done(info)
		l.cancel()
	}
	// drain reads what the engines delivered up to now; timed-out
	// requests are aborted and end at once.
	drain := func(now time.Time, ready func(rep int) bool) {
		kept := lives[:0]
		for _, l := range lives {
			timedOut := now.Sub(l.sent) >= timeout
			if timedOut {
				l.cancel()
			}
			done := false
			for read := timedOut || ready(l.rep); read && !done; {
				u, ok := nextUpdate(l.ch, timedOut)
				if !ok {
					break
				}
				if u.Generated > 0 && l.first.IsZero() {
					l.first = now
				}
				l.tokens, l.prompt, l.cachedTk = u.Generated, u.PromptTokens, u.CachedTokens
				if u.Done {
					err := u.Err
					if timedOut && err == nil {
						err = context.DeadlineExceeded
					}
					finish(l, now, err)
					done = true
				}
			}
			if !done {
				kept = append(kept, l)
			}
		}
		clear(lives[len(kept):])
		lives = kept
	}
	readyAt := func(r *replica, now time.Time) time.Time {
		return maxTime(r.e.WallTime(r.e.Snapshot().ModelTime), now)
	}
	far := t0.Add(1000 * time.Hour)
	for now := t0; ; {
		// The next event: an engine's step end, a send, a scrape, a queue
		// expiry or a client timeout.
		t := nextScrape
		busy := false
		for _, r := range reps {
			if r.live > 0 {
				t, busy = minTime(t, readyAt(r, now)), true
			}
		}
		if next < len(w.Requests) && inFlight < o.MaxInFlight {
			t = minTime(t, t0.Add(w.Requests[next].At))
		}
		if len(queue) > 0 {
			t = minTime(t, queue[0].at.Add(cfg.Admission.QueueTTL))
		}
		for _, l := range lives {
			t = minTime(t, l.sent.Add(timeout))
		}
		if !busy && next == len(w.Requests) && len(queue) == 0 {
			break
		}
		require.True(tb, t.Before(far), "replay stuck")
		now = maxTime(t, now)
		clock.set(now)
		stepped := make([]bool, len(reps))
		drain(now, func(i int) bool {
			stepped[i] = !readyAt(reps[i], now).After(now)
			return stepped[i]
		})
		if !nextScrape.After(now) {
			scrape(now)
			nextScrape = nextScrape.Add(cfg.Signals.ScrapeInterval)
		}
		for next < len(w.Requests) && inFlight < o.MaxInFlight && !t0.Add(w.Requests[next].At).After(now) {
			st := w.Requests[next].Stage
			if firstSend[st].IsZero() {
				firstSend[st] = now
			}
			queue = append(queue, sent{n: next, at: now})
			next++
			inFlight++
		}
		for len(queue) > 0 {
			q := queue[0]
			if now.Sub(q.at) >= cfg.Admission.QueueTTL {
				st := &stages[w.Requests[q.n].Stage]
				st.Requests++
				st.Errors++
				inFlight--
				queue = queue[1:]
				continue
			}
			if *cfg.Admission.Enabled && s.Headroom(sc.Model, "", nil) != scheduler.HeadroomOK {
				st := &stages[w.Requests[q.n].Stage]
				st.held++
				for _, r := range reps {
					kv, wt := r.sig.KVUsage/cfg.Scoring.KVCeiling, r.sig.Waiting/cfg.Scoring.TargetWaiting
					st.kvTerm += kv / float64(len(reps))
					st.waitTerm += wt / float64(len(reps))
				}
				break
			}
			route(q, now)
			queue = queue[1:]
		}
		for _, r := range reps {
			if r.live > 0 && !readyAt(r, now).After(now) {
				if r.e.Step() == 0 && r.e.Snapshot().Running+r.e.Snapshot().Waiting > 0 {
					tb.Fatal("engine idle with requests in flight")
				}
			}
		}
	}
	for i, r := range reps {
		tb.Logf("replica %d: %d groups first, %d requests, hit %.3f, mean KV usage %.3f", i, r.groups, r.requests,
			float64(r.cached)/float64(max(r.prompt, 1)), r.kv/float64(max(r.scrapes, 1)))
	}
	var prompt, cached int64
	for i := range stages {
		st := &stages[i]
		st.TTFTP90ms = stat.Percentile(stat.SortedMillis(ttfts[i], scale), 90)
		if span := lastEnd[i].Sub(firstSend[i]).Seconds() * scale; span > 0 {
			st.OutputTokPS = float64(outTok[i]) / k / span
		}
		if st.prompt > 0 {
			st.CachedTokens = float64(st.cached) / float64(st.prompt)
		}
		prompt += st.prompt
		cached += st.cached
	}
	return stages, float64(cached) / float64(prompt) / w.Bound
}

// awayCause says why a request went elsewhere while holders held its
// group's system prompt (see the why* constants); sig(i) is replica i's
// last scrape.
func awayCause(holders map[int]bool, d *scheduler.Decision, cfg scheduler.Config, sig func(int) *metrics.Signals) string {
	switch d.Reason {
	case scheduler.ReasonRecall:
		return whyRecall
	case scheduler.ReasonPrefix:
		return whyCredit
	case scheduler.ReasonOverride:
		return whyGuard
	}
	for h := range holders {
		if sig(h).KVUsage <= cfg.Scoring.KVCeiling {
			return whyScore
		}
	}
	return whyKVFilter
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// BenchmarkReplaySchedulerLLMD73 replays the llmd-73 preset (k = 0.1)
// through the real scheduler for precise, approximate and random
// (replayScheduler) and reports inference-perf's summary across stages,
// the engines' hit rate against the workload's bound and the share of
// requests routed to a replica holding their group's system prompt; -v
// logs each stage with the causes of the requests sent elsewhere, and
// each replica's groups, requests, hit rate and mean KV usage.
//
// The bench's EPP scrapes a simulated fleet every 250 ms of wall time, 1 s
// of this preset's model time; the scrape-2s cases scrape every 2 s of
// model time, the production default (signals.scrape_interval) on a fleet
// running in real time.
//
//	go test ./bench/compare -run '^$' -bench ReplaySchedulerLLMD73 -benchtime 1x -v
func BenchmarkReplaySchedulerLLMD73(b *testing.B) {
	production := time.Duration(float64(2*time.Second) / LLMD73Options(0.1).Fleet.TimeScale)
	for _, c := range []struct {
		name, policy string
		scrape       time.Duration // wall time
	}{
		{scheduler.PolicyPrecise, scheduler.PolicyPrecise, rig.ScrapeInterval},
		{scheduler.PolicyApproximate, scheduler.PolicyApproximate, rig.ScrapeInterval},
		{scheduler.PolicyRandom, scheduler.PolicyRandom, rig.ScrapeInterval},
		{scheduler.PolicyPrecise + "-scrape-2s", scheduler.PolicyPrecise, production},
		{scheduler.PolicyApproximate + "-scrape-2s", scheduler.PolicyApproximate, production},
	} {
		b.Run(c.name, func(b *testing.B) {
			var stages []replayStage
			var hitBound float64
			for range b.N {
				stages, hitBound = replayScheduler(b, 0.1, c.policy, func(cfg *scheduler.Config) {
					cfg.Signals.ScrapeInterval, cfg.Signals.ScrapeTimeout = c.scrape, c.scrape
				})
			}
			var lines []string
			var srs []StageResult
			home, n := 0, 0
			for _, st := range stages {
				srs = append(srs, st.StageResult)
				sn := st.home + st.away + st.cold
				home, n = home+st.home, n+sn
				qs := stat.SortedMillis(st.queued, 4)
				held := float64(max(st.held, 1))
				lines = append(lines, fmt.Sprintf("QPS %2.0f: TTFT p90 %6.0f ms, %5.0f tok/s, hit %.2f, home %.2f away %.2f cold %.2f, admission wait p90 %5.0f ms (kv term %.2f, queue term %.2f), %d failed, away: %v",
					st.QPS, st.TTFTP90ms, st.OutputTokPS, st.CachedTokens, frac(st.home, sn), frac(st.away, sn), frac(st.cold, sn),
					stat.Percentile(qs, 90), st.kvTerm/held, st.waitTerm/held, st.Errors, st.why))
			}
			sum := acrossStages(srs)
			b.ReportMetric(sum.TTFTP90ms, "ttft_p90_ms")
			b.ReportMetric(sum.OutputTokPS, "out_tok/s")
			b.ReportMetric(hitBound, "hit/bound")
			b.ReportMetric(frac(home, n), "home")
			b.Logf("\n%s", strings.Join(lines, "\n"))
		})
	}
}

func frac(a, n int) float64 {
	if n == 0 {
		return math.NaN()
	}
	return float64(a) / float64(n)
}
