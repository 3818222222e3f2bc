package scheduler

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/metrics"
	"github.com/omnious/provider-node/kvindex"
)

// updateDecisions re-records testdata/decisions.golden:
//
//	go test ./scheduler/ -run TestDecisionsGolden -update-decisions
var updateDecisions = flag.Bool("update-decisions", false, "re-record testdata/decisions.golden")

const decisionsGolden = "testdata/decisions.golden"

// TestDecisionsGolden replays random fleets and request streams through
// Admit, Pick and Done and compares every outcome (admission error, or
// reason, mode, matched blocks and the endpoints in order) with the
// recorded ones. The fleets mix what the per-replica passes branch on:
// stale, never scraped and unmetered replicas, metrics URLs shared by two
// replicas, KV usage over the ceiling, open and half-open breakers, LoRA
// adapters, subset hints, sessions, prompts held in the index at every
// tier, speculative credit and the routing memory, for every policy and
// with softmax sampling. Any change to how a decision is computed that
// changes one of them shows here, with the decision that moved.
func TestDecisionsGolden(t *testing.T) {
	var got strings.Builder
	for sc := range 48 {
		replayScenario(t, &got, sc)
	}
	if *updateDecisions {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(decisionsGolden, []byte(got.String()), 0o644))
		return
	}
	want, err := os.ReadFile(decisionsGolden)
	require.NoError(t, err, "record it with: go test ./scheduler/ -run TestDecisionsGolden -update-decisions")
	wantLines, gotLines := strings.Split(string(want), "\n"), strings.Split(got.String(), "\n")
	for i := range min(len(wantLines), len(gotLines)) {
		require.Equal(t, wantLines[i], gotLines[i], "line %d", i+1)
	}
	require.Len(t, gotLines, len(wantLines))
}

// replayScenario builds scenario sc's fleet and plays its requests,
// writing one line per decision to out.
func replayScenario(t *testing.T, out *strings.Builder, sc int) {
	rng := rand.New(rand.NewPCG(uint64(sc), 0x5eed))
	policies := []string{PolicyPrecise, PolicyPrecise, PolicyPrecise, PolicyApproximate, PolicyAgent, PolicyLeastQueue, PolicyRandom, PolicyRoundRobin}
	policy := policies[sc%len(policies)]
	sizes := []int{1, 2, 5, 16, 64, 200}
	n := sizes[rng.IntN(len(sizes))]
	if sc%16 == 3 {
		n = 1024
	}
	temperature := 0.0
	if rng.IntN(5) == 0 {
		temperature = 0.2
	}
	cfg := DefaultConfig()
	cfg.Seed = int64(sc + 1)
	cfg.Policy = policy
	cfg.Fallbacks = ptr(rng.IntN(4))
	cfg.Scoring.Temperature = temperature
	cfg.Adapters = map[string]string{"sql": testModel}
	// Admission without a queue answers at once: queue_full above a band's
	// ceiling, so the saturation sum is checked without waiting.
	cfg.Admission.Enabled = ptr(rng.IntN(2) == 0)
	cfg.Admission.QueueCapacityPerBand = ptr(0)
	cfg.Admission.TargetInflight = 16
	ix := kvindex.New(kvindex.Config{})
	s, err := New(cfg, ix, nil, nil)
	require.NoError(t, err)
	clock := newFakeClock()
	s.now = clock.Now

	eps := make([]Target, n)
	for i := range eps {
		ep := endpoint.Endpoint{Addr: addr(i), Model: testModel, Engine: "vllm", MetricsURL: fmt.Sprintf("http://m/%d", i)}
		switch k := rng.IntN(20); {
		case k == 0:
			ep.Model = "other"
		case k == 1:
			ep.MetricsURL = "" // unmetered: never stale
		case k == 2 && i > 0:
			ep.MetricsURL = eps[i-1].MetricsURL // two replicas behind one URL
		}
		eps[i] = Target{Replica: kvindex.Replica(i), Endpoint: ep}
	}
	s.SetEndpoints(eps)
	snap := s.snap.Load()
	// A replica never scraped is stale once stale_after has passed since
	// it joined.
	clock.Add(cfg.Signals.StaleAfter + time.Second)

	observe := func(i int, at time.Time) {
		r := snap.byAddr[addr(i)]
		if r.ep.MetricsURL == "" {
			return
		}
		sig := metrics.Signals{Engine: metrics.EngineVLLM, Running: float64(rng.IntN(12)), Waiting: float64(rng.IntN(6)),
			KVUsage: 0.95 * rng.Float64()}
		if rng.IntN(6) == 0 {
			sig.RunningLoRA = "sql"
		}
		if rng.IntN(8) == 0 {
			sig.WaitingLoRA = "chat"
		}
		s.Observe(&metrics.Sample{URL: r.ep.MetricsURL, Signals: sig, At: at})
	}
	for i := range n {
		switch rng.IntN(10) {
		case 0: // never scraped
		case 1:
			observe(i, clock.Now().Add(-time.Minute)) // stale
		default:
			observe(i, clock.Now())
		}
	}
	for i := range n {
		if rng.IntN(12) == 0 {
			r := snap.byAddr[addr(i)]
			for range 3 {
				r.br.request(false, clock.Now(), cfg.Breaker.FailureThreshold)
			}
		}
	}
	if rng.IntN(3) == 0 {
		clock.Add(cfg.Breaker.Cooldown) // open breakers turn half-open
	}

	// Prompt families: a shared system prompt and a few documents.
	families := make([][]uint32, 4)
	for f := range families {
		families[f] = tokens(2048, uint32(sc*16+f))
	}
	root := kvindex.RootKey(testModel, "", "")
	for i := range n {
		for f := range families {
			if rng.IntN(3) != 0 {
				continue
			}
			blocks := 1 + rng.IntN(len(families[f])/cfg.BlockSize)
			keys := kvindex.AppendBlockKeys(nil, root, families[f][:blocks*cfg.BlockSize], cfg.BlockSize)
			tier := kvindex.TierGPU
			if rng.IntN(5) == 0 {
				tier = kvindex.Tier(rng.IntN(3))
			}
			ix.Store(kvindex.Replica(i), tier, keys)
		}
	}

	type open struct{ d *Decision }
	var pending []open
	for q := range 40 {
		f := rng.IntN(len(families))
		toks := append([]uint32(nil), families[f][:256+rng.IntN(len(families[f])-256)]...)
		toks = append(toks, tokens(rng.IntN(300), uint32(1_000_000+sc*100+q))...)
		req := &Request{ID: fmt.Sprint(q), Model: testModel, Tokens: toks, Arrived: clock.Now()}
		if policy == PolicyApproximate || rng.IntN(10) == 0 {
			req.Tokens = nil
			for _, tok := range toks {
				req.PromptText = binary.LittleEndian.AppendUint32(req.PromptText, tok)
			}
		}
		switch k := rng.IntN(12); {
		case k == 0:
			req.Model = "sql"
		case k == 1:
			req.Model = "chat"
		case k == 2:
			req.Subset = []string{addr(rng.IntN(n)), addr(rng.IntN(n)), "10.9.9.9:1"}
		}
		if rng.IntN(3) == 0 {
			req.SessionKey = fmt.Sprintf("s%d", rng.IntN(5))
		}
		if rng.IntN(4) == 0 {
			req.Band = []string{"platinum", "gold", "silver", "bronze"}[rng.IntN(4)]
		}
		fmt.Fprintf(out, "%d/%d %s n=%d: ", sc, q, policy, n)
		d, err := s.admitPick(context.Background(), req)
		if err != nil {
			var se *Error
			require.True(t, errors.As(err, &se), "%v", err)
			fmt.Fprintf(out, "error %s\n", se.Reason)
		} else {
			fmt.Fprintf(out, "%s %s %d/%d", d.Reason, d.Mode, d.PrefixBlocks, d.PromptBlocks)
			for _, ep := range d.Endpoints {
				fmt.Fprintf(out, " %s", ep.Addr)
			}
			fmt.Fprintln(out)
			pending = append(pending, open{d})
		}
		// Some requests end, with a success, a failure or no verdict.
		for len(pending) > 0 && rng.IntN(3) != 0 {
			k := rng.IntN(len(pending))
			status := []int{200, 200, 200, 500, 0}[rng.IntN(5)]
			pending[k].d.Done(DoneInfo{Status: status, PromptTokens: 10})
			pending = append(pending[:k], pending[k+1:]...)
		}
		clock.Add(time.Duration(rng.IntN(800)) * time.Millisecond)
		for range rng.IntN(1 + n/4) {
			observe(rng.IntN(n), clock.Now())
		}
		if rng.IntN(4) == 0 {
			i := rng.IntN(n)
			keys := kvindex.AppendBlockKeys(nil, root, toks[:len(toks)/cfg.BlockSize*cfg.BlockSize], cfg.BlockSize)
			ix.Store(kvindex.Replica(i), kvindex.TierGPU, keys)
		}
	}
	for _, p := range pending {
		p.d.Done(DoneInfo{Status: 200})
	}
}
