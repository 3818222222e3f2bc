package compare

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/bench/internal/stat"
	"github.com/omnious/provider-node/bench/rig"
	"github.com/omnious/provider-node/engines/sim/engine"
)

// fakeClock is a manual clock; SleepUntil jumps to the deadline at once.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) SleepUntil(_ context.Context, t time.Time) { c.set(t) }

func (c *fakeClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.t) {
		c.t = t
	}
}

type fleetResult struct {
	at, first, end time.Duration
	tokens, stage  int
	failed         bool
}

// nextUpdate reads ch's next update: waiting for it when wait (an
// aborted request's final update follows at once), else only when one is
// there.
func nextUpdate(ch <-chan engine.Update, wait bool) (engine.Update, bool) {
	if wait {
		return <-ch, true
	}
	select {
	case u := <-ch:
		return u, true
	default:
		return engine.Update{}, false
	}
}

// replayPublished replays the llmd-73 preset at scale k straight on its
// simulated engines, without the EPP, the gateway or HTTP: 8 engines with
// fake clocks, each request sent to route(group, arrival index), the
// preset's client concurrency (split evenly over the replicas) and
// timeout. It returns inference-perf's summary across stages, tok/s in
// original tokens.
func replayPublished(tb testing.TB, k float64, route func(g, n int) int) (StageSummary, []string) {
	tb.Helper()
	o := LLMD73Options(k).WithDefaults()
	sp, f := o.Workload.SharedPrefix, o.Fleet
	rng := rand.New(rand.NewPCG(42, 73))
	type prompt struct {
		g      int
		tokens []uint32
	}
	var prompts []prompt
	for g := range sp.NumGroups {
		sys := make([]uint32, sp.SystemPromptLen)
		for i := range sys {
			sys[i] = rng.Uint32N(150_000)
		}
		for range sp.PromptsPerGroup {
			p := slices.Clone(sys)
			for range sp.QuestionLen {
				p = append(p, rng.Uint32N(150_000))
			}
			prompts = append(prompts, prompt{g: g, tokens: p})
		}
	}
	rng.Shuffle(len(prompts), func(i, j int) { prompts[i], prompts[j] = prompts[j], prompts[i] })

	type arrival struct {
		at            time.Duration
		prompt, stage int
	}
	var arrivals []arrival
	var start time.Duration
	for s, d := range sp.StageLengths() {
		q := sp.QPS[s]
		for t := rng.ExpFloat64() / q; t < d.Seconds(); t += rng.ExpFloat64() / q {
			arrivals = append(arrivals, arrival{at: start + time.Duration(t*float64(time.Second)),
				prompt: len(arrivals) % len(prompts), stage: s})
		}
		start += d
	}
	perReplica := make([][]arrival, f.Replicas)
	for n, a := range arrivals {
		r := route(prompts[a.prompt].g, n)
		perReplica[r] = append(perReplica[r], a)
	}

	cfg := rig.SimConfig(f, 1, 0).Engine
	cfg.TimeScale = 1 // model time is the fake clock's
	timeout := time.Duration(float64(o.RequestTimeout) * f.TimeScale)
	output := make([]uint32, sp.OutputLen)
	for i := range output {
		output[i] = uint32(i + 1)
	}

	var results []fleetResult
	for r := range f.Replicas {
		clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
		e, err := engine.New(cfg, nil, nil, engine.WithClock(clock))
		require.NoError(tb, err)
		type live struct {
			ch     <-chan engine.Update
			cancel context.CancelFunc
			res    fleetResult
		}
		var active []*live
		next := perReplica[r]
		limit := o.MaxInFlight / f.Replicas
		for len(next) > 0 || len(active) > 0 {
			now := e.Snapshot().ModelTime
			if len(active) == 0 && next[0].at > now {
				clock.set(e.WallTime(next[0].at))
				now = next[0].at
			}
			for len(next) > 0 && next[0].at <= now && len(active) < limit {
				a := next[0]
				next = next[1:]
				ctx, cancel := context.WithCancel(context.Background())
				ch, err := e.Submit(ctx, &engine.Request{ID: "r", Prompt: prompts[a.prompt].tokens, Output: output})
				require.NoError(tb, err)
				// Latencies count from the send, as the client measures them.
				active = append(active, &live{ch: ch, cancel: cancel, res: fleetResult{at: max(a.at, now), stage: a.stage, first: -1}})
			}
			if e.Step() == 0 {
				tb.Fatal("engine idle with requests in flight")
			}
			now = e.Snapshot().ModelTime
			clock.set(e.WallTime(now))
			kept := active[:0]
			for _, l := range active {
				timedOut := now-l.res.at >= timeout
				if timedOut {
					l.cancel() // the abort's final update follows at once
				}
				done := false
				for !done {
					u, ok := nextUpdate(l.ch, timedOut)
					if !ok {
						break
					}
					if u.Generated > 0 && l.res.first < 0 {
						l.res.first = now
					}
					l.res.tokens = u.Generated
					if u.Done {
						l.res.failed, l.res.end, done = u.Err != nil, now, true
						results = append(results, l.res)
						l.cancel()
					}
				}
				if !done {
					kept = append(kept, l)
				}
			}
			clear(active[len(kept):])
			active = kept
		}
	}

	stages := make([]StageResult, len(sp.QPS))
	var lines []string
	for s := range stages {
		var ttft []time.Duration
		first, last := time.Duration(-1), time.Duration(0)
		tokens := 0
		st := StageResult{QPS: sp.QPS[s], Warmup: s < sp.WarmupStages}
		for _, res := range results {
			if res.stage != s {
				continue
			}
			st.Requests++
			if first < 0 || res.at < first {
				first = res.at
			}
			last = max(last, res.end)
			if res.failed {
				st.Errors++
				continue
			}
			ttft = append(ttft, res.first-res.at)
			tokens += res.tokens
		}
		st.TTFTP90ms = stat.Percentile(stat.SortedMillis(ttft, 1), 90)
		st.OutputTokPS = float64(tokens) / k / (last - first).Seconds()
		stages[s] = st
		lines = append(lines, fmt.Sprintf("QPS %2.0f: TTFT p90 %8.0f ms, %6.0f tok/s, %4d failed", st.QPS, st.TTFTP90ms, st.OutputTokPS, st.Errors))
	}
	return acrossStages(stages), lines
}

// BenchmarkPublishedLLMD73 replays the llmd-73 preset on its simulated
// engines alone with two idealised routers: each group to one replica
// (what precise prefix routing converges to on this workload) and
// uniformly random. It reports the summary across stages, to set beside
// the published one (precise 0.542 s and 8,730 tok/s, random 92.6 s and
// 4,429 tok/s), at three scales, so that a scaling error shows as a
// difference between them:
//
//	go test ./bench/compare -run '^$' -bench PublishedLLMD73 -benchtime 1x -v
func BenchmarkPublishedLLMD73(b *testing.B) {
	for _, k := range []float64{0.1, 0.25, 1} {
		rr := rand.New(rand.NewPCG(1, 2))
		routers := []struct {
			name  string
			route func(g, n int) int
		}{
			{"affinity", func(g, _ int) int { return g % 8 }},
			{"random", func(int, int) int { return rr.IntN(8) }},
		}
		for _, rt := range routers {
			b.Run(fmt.Sprintf("k=%g/%s", k, rt.name), func(b *testing.B) {
				var s StageSummary
				var lines []string
				for range b.N {
					s, lines = replayPublished(b, k, rt.route)
				}
				b.ReportMetric(s.TTFTP90ms, "ttft_p90_ms")
				b.ReportMetric(s.OutputTokPS, "out_tok/s")
				b.Logf("\n%s", strings.Join(lines, "\n"))
			})
		}
	}
}
