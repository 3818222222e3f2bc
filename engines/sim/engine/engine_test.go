package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/kvevents"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(c *Config)
		wantErr string
	}{
		{"defaults", func(c *Config) {}, ""},
		{"flavour", func(c *Config) { c.Flavour = "tgi" }, `flavour "tgi"`},
		{"block size", func(c *Config) { c.BlockSize = -1 }, "block_size -1"},
		{"gpu blocks", func(c *Config) { c.NumGPUBlocks = -3 }, "num_gpu_blocks -3"},
		{"only the null block", func(c *Config) { c.NumGPUBlocks = 1 }, "num_gpu_blocks 1"},
		{"one sglang block", func(c *Config) { c.Flavour, c.NumGPUBlocks = FlavourSGLang, 1 }, ""},
		{"cpu blocks", func(c *Config) { c.NumCPUBlocks = -1 }, "num_cpu_blocks -1"},
		{"max seqs", func(c *Config) { c.MaxNumSeqs = -1 }, "max_num_seqs -1"},
		{"budget", func(c *Config) { c.MaxNumBatchedTokens = -1 }, "max_num_batched_tokens -1"},
		{"time scale", func(c *Config) { c.TimeScale = -2 }, "time_scale -2"},
		{"timing", func(c *Config) { c.Timing.DecodeBase = new(-time.Millisecond) }, "timing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{}
			tt.mutate(&c)
			c = c.WithDefaults()
			err := c.Validate()
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
			_, err = New(c, nil, nil)
			require.Error(t, err)
		})
	}
	d := Config{}.WithDefaults()
	require.Equal(t, FlavourVLLM, d.Flavour)
	require.Equal(t, 16, d.BlockSize)
	require.Equal(t, DefaultKVTokens/16, d.NumGPUBlocks)
	require.Equal(t, 256, d.MaxNumSeqs)
	require.Equal(t, 8192, d.MaxNumBatchedTokens)
	require.Equal(t, 1.0, d.TimeScale)
	require.Equal(t, 63*time.Microsecond, *d.Timing.PrefillPerToken)
}

// TestNullBlock: a vllm-flavoured engine given vLLM's num_gpu_blocks holds
// KV in all but one of them, as vLLM's BlockPool keeps its null block
// (usage is over the rest, the reported count is the configured one);
// sglang uses every block.
func TestNullBlock(t *testing.T) {
	tests := []struct {
		flavour string
		usable  int
	}{
		{FlavourVLLM, 2},
		{FlavourSGLang, 3},
	}
	for _, tt := range tests {
		t.Run(tt.flavour, func(t *testing.T) {
			h := newHarness(t, Config{Flavour: tt.flavour, BlockSize: 4, NumGPUBlocks: 3})
			_, err := h.e.Submit(context.Background(), &Request{ID: "big", Prompt: seq(0, 4*tt.usable), Output: []uint32{1, 2}})
			require.ErrorContains(t, err, fmt.Sprintf("cache has %d", tt.usable))
			// A request filling every usable block runs at full usage.
			up := h.submit("fit", seq(0, 4*tt.usable-1), []uint32{1, 2})
			h.step()
			s := h.e.Snapshot()
			require.Equal(t, tt.usable, s.UsedBlocks)
			require.InDelta(t, 1.0, s.KVUsage, 1e-9)
			require.Equal(t, 3, s.NumGPUBlocks, "the engine reports the configured count")
			h.runIdle()
			drain(t, up)
		})
	}
}

func TestSubmitRejects(t *testing.T) {
	h := newHarness(t, Config{BlockSize: 4, NumGPUBlocks: 5}) // 4 and vLLM's null block
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name    string
		ctx     context.Context
		req     *Request
		wantErr string
	}{
		{"nil", context.Background(), nil, "nil request"},
		{"empty prompt", context.Background(), &Request{ID: "x", Output: []uint32{1}}, "empty prompt"},
		{"no output", context.Background(), &Request{ID: "x", Prompt: []uint32{1}}, "no output"},
		{"longer than cache", context.Background(), &Request{ID: "x", Prompt: seq(0, 16), Output: []uint32{1, 2}}, "need 5 KV blocks, cache has 4"},
		{"bad finish reason", context.Background(), &Request{ID: "x", Prompt: seq(0, 4), Output: []uint32{1}, FinishReason: "eos"}, "finish reason"},
		{"cancelled", cancelled, &Request{ID: "x", Prompt: seq(0, 4), Output: []uint32{1}}, "context canceled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.e.Submit(tt.ctx, tt.req)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
	// Exactly the cache size fits: the last output token needs no KV.
	h.complete("fits", seq(0, 16), []uint32{1})
	require.Zero(t, h.e.Snapshot().Waiting)
}

func TestPreemption(t *testing.T) {
	h := newHarness(t, Config{BlockSize: 4, NumGPUBlocks: 6})
	// Each needs up to 5 blocks; together they overflow the cache.
	a := h.submit("a", seq(1, 8), seq(100, 12))
	b := h.submit("b", seq(51, 8), seq(200, 12))
	h.runIdle()
	for _, ch := range []<-chan Update{a, b} {
		ups := drain(t, ch)
		require.Equal(t, 12, ups[len(ups)-1].Generated)
		require.NoError(t, ups[len(ups)-1].Err)
	}
	st := h.e.Snapshot()
	require.Positive(t, st.Preemptions)
	require.Equal(t, int64(24), st.GenerationTokens, "recompute does not generate again")
	require.Equal(t, int64(16), st.PromptTokens)
	require.Zero(t, st.UsedBlocks)
	require.Equal(t, residentSet(h.e.Resident()), replay(t, h.sink.events(), 4))
}

func TestChunkedPrefillBudget(t *testing.T) {
	const budget = 64
	h := newHarness(t, Config{BlockSize: 16, NumGPUBlocks: 64, MaxNumBatchedTokens: budget})
	a := h.submit("a", seq(1, 200), seq(1000, 3))
	b := h.submit("b", seq(5001, 100), seq(2000, 3))
	total, steps, firstA := 0, 0, 0
	for {
		p := h.e.step()
		if p.dur == 0 {
			break
		}
		steps++
		n := p.prefillTokens + p.decodeSeqs
		require.LessOrEqual(t, n, budget, "step %d", steps)
		total += p.prefillTokens
		for _, em := range p.emissions {
			if em.req.ID == "a" && em.first {
				firstA = steps
			}
		}
		h.e.commit(p)
	}
	require.Equal(t, 300, total, "every prompt token is computed once")
	require.Equal(t, 4, firstA, "200 tokens in chunks of 64")
	drain(t, a)
	drain(t, b)
}

func TestStepTiming(t *testing.T) {
	ti := roundTiming
	const blocks = 100
	// vLLM's usage is over the blocks besides its null block.
	h := newHarness(t, Config{BlockSize: 16, NumGPUBlocks: blocks + 1, Timing: ti.timing()})
	occ := func(nblocks int) time.Duration {
		return time.Duration(float64(nblocks) / blocks * float64(ti.KVTerm))
	}
	a := h.submit("a", seq(1, 100), seq(1000, 3))
	// 1: prefill a (100 tokens).
	require.Equal(t, ti.PrefillBase+100*ti.PrefillPerToken, h.step())
	// 2: decode a (101 tokens, 7 blocks) and prefill b (150 tokens, 10
	// blocks) in one pass: b's chunk outlasts the weight read.
	b := h.submit("b", seq(5001, 150), seq(2000, 2))
	s2 := ti.PrefillBase + 150*ti.PrefillPerToken + ti.DecodePerSeq + occ(17)
	require.Equal(t, s2, h.step())
	// 3: decode a and b; a finishes.
	require.Equal(t, ti.DecodeBase+2*ti.DecodePerSeq+occ(7+10), h.step())
	require.Zero(t, h.step(), "idle")
	upsA, upsB := drain(t, a), drain(t, b)
	require.Equal(t, 3, upsA[len(upsA)-1].Generated)
	require.Equal(t, 2, upsB[len(upsB)-1].Generated)

	// Model-time latencies: a's TTFT is step 1.
	s1 := ti.PrefillBase + 100*ti.PrefillPerToken
	fam := gather(t, h.e)["vllm:time_to_first_token_seconds"]
	require.NotNil(t, fam)
	hist := fam.GetMetric()[0].GetHistogram()
	require.Equal(t, uint64(2), hist.GetSampleCount())
	require.InDelta(t, (s1 + s2).Seconds(), hist.GetSampleSum(), 1e-9, "a after step 1, b after step 2 (b arrived at the end of step 1)")
}

func TestRestart(t *testing.T) {
	h := newHarness(t, Config{BlockSize: 4, NumGPUBlocks: 32})
	ch := h.submit("a", seq(1, 40), seq(100, 50))
	h.step()
	h.step()
	require.NotEmpty(t, h.e.Resident())
	h.e.Restart()
	ups := drain(t, ch)
	require.ErrorIs(t, ups[len(ups)-1].Err, ErrRestarted)
	require.Empty(t, h.e.Resident())
	require.Zero(t, h.e.Snapshot().Running)
	require.Zero(t, h.e.Snapshot().UsedBlocks)

	require.Zero(t, h.step())
	evs := h.sink.events()
	require.Equal(t, kvevents.KindAllBlocksCleared, evs[len(evs)-1].Kind)

	// The engine serves again from an empty cache.
	ups = h.complete("b", seq(1, 40), seq(100, 2))
	require.Zero(t, ups[0].CachedTokens)
	require.Equal(t, residentSet(h.e.Resident()), replay(t, h.sink.events(), 4))
}

func TestCancelFreesBlocks(t *testing.T) {
	h := newHarness(t, Config{BlockSize: 4, NumGPUBlocks: 32})
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := h.e.Submit(ctx, &Request{ID: "a", Prompt: seq(1, 30), Output: seq(100, 50)})
	require.NoError(t, err)
	h.step()
	h.step()
	require.Positive(t, h.e.Snapshot().UsedBlocks)
	cancel()
	ups := drain(t, ch) // the abort runs on the context's goroutine
	last := ups[len(ups)-1]
	require.ErrorIs(t, last.Err, context.Canceled)
	require.Equal(t, 2, last.Generated)
	st := h.e.Snapshot()
	require.Zero(t, st.UsedBlocks)
	require.Zero(t, st.Running)
	require.Zero(t, h.step())
	fam := gather(t, h.e)["vllm:request_success_total"]
	got := map[string]float64{}
	for _, m := range fam.GetMetric() {
		got[labelsOf(m)["finished_reason"]] = m.GetCounter().GetValue()
	}
	require.Equal(t, map[string]float64{"abort": 1, "stop": 0, "length": 0}, got)
}

func TestUpdatesCoalesce(t *testing.T) {
	h := newHarness(t, Config{BlockSize: 16, NumGPUBlocks: 64})
	// Nobody reads until the request is over: the loop must not block.
	ups := h.complete("a", seq(1, 20), seq(100, 5*updateBuffer))
	require.LessOrEqual(t, len(ups), updateBuffer)
	require.Equal(t, Update{Generated: 5 * updateBuffer, PromptTokens: 20, Done: true}, ups[len(ups)-1])
}

func TestRunLoop(t *testing.T) {
	for _, clk := range []struct {
		name  string
		clock Clock
		scale float64
	}{
		{"fake clock", newFakeClock(), 1},
		{"real clock, 1000x", realClock{}, 1000},
	} {
		t.Run(clk.name, func(t *testing.T) {
			sink := &recordingSink{}
			e, err := New(Config{BlockSize: 16, NumGPUBlocks: 256, TimeScale: clk.scale}, sink, nil, WithClock(clk.clock))
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { e.Run(ctx); close(done) }()

			var chans []<-chan Update
			for i := range 3 {
				ch, err := e.Submit(context.Background(), &Request{ID: fmt.Sprint(i), Prompt: seq(i*1000, 100), Output: seq(1, 10)})
				require.NoError(t, err)
				chans = append(chans, ch)
			}
			for _, ch := range chans {
				ups := drain(t, ch)
				require.Equal(t, 10, ups[len(ups)-1].Generated)
			}
			cancel()
			<-done
			require.Equal(t, residentSet(e.Resident()), replay(t, sink.events(), 16))
		})
	}
}

func TestRunStopEndsRequests(t *testing.T) {
	e, err := New(Config{}, nil, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	// About 20 s of model time at TimeScale 1: still running when Run stops.
	ch, err := e.Submit(context.Background(), &Request{ID: "late", Prompt: seq(1, 100), Output: seq(1, 2000)})
	require.NoError(t, err)
	cancel()
	<-done
	ups := drain(t, ch)
	require.ErrorIs(t, ups[len(ups)-1].Err, ErrStopped)
	require.Zero(t, e.Snapshot().UsedBlocks)
	_, err = e.Submit(context.Background(), &Request{ID: "after", Prompt: seq(1, 10), Output: seq(1, 2)})
	require.ErrorIs(t, err, ErrStopped)
}

// TestEventsReplayToResident drives a random workload with shared prefixes,
// LoRA, salts, cancellations, preemption, a CPU tier and a restart, and checks
// after every step that replaying the published events gives exactly the
// engine's resident set.
func TestEventsReplayToResident(t *testing.T) {
	for _, flavour := range []string{FlavourVLLM, FlavourSGLang} {
		t.Run(flavour, func(t *testing.T) {
			h := newHarness(t, Config{Flavour: flavour, BlockSize: 4, NumGPUBlocks: 40, NumCPUBlocks: 12,
				MaxNumBatchedTokens: 48, MaxNumSeqs: 6})
			rng := rand.New(rand.NewPCG(1, 2))
			prefixes := [][]uint32{seq(0, 12), seq(100, 20), seq(200, 6), seq(300, 30)}
			loras := []string{"", "", "", "ad1"}
			salts := []string{"", "", "", "", "s"}
			var chans []<-chan Update
			var cancels []context.CancelFunc
			check := func() {
				require.Equal(t, residentSet(h.e.Resident()), replay(t, h.sink.events(), 4))
			}
			for i := range 120 {
				if i%3 == 0 {
					prompt := append([]uint32(nil), prefixes[rng.IntN(len(prefixes))]...)
					prompt = append(prompt, seq(rng.IntN(50)*7, rng.IntN(14))...)
					ctx, cancel := context.WithCancel(context.Background())
					cancels = append(cancels, cancel)
					ch, err := h.e.Submit(ctx, &Request{ID: fmt.Sprint(i), Prompt: prompt, Output: seq(rng.IntN(3)*10, 1+rng.IntN(24)),
						LoraName: loras[rng.IntN(len(loras))], CacheSalt: salts[rng.IntN(len(salts))]})
					require.NoError(t, err)
					chans = append(chans, ch)
				}
				if i%17 == 0 {
					cancels[rng.IntN(len(cancels))]()
				}
				if i == 60 {
					h.e.Restart()
				}
				h.step()
				check()
			}
			h.runIdle()
			check()
			for _, c := range cancels {
				c()
			}
			for _, ch := range chans {
				drain(t, ch)
			}
			st := h.e.Snapshot()
			require.Zero(t, st.UsedBlocks)
			require.Positive(t, st.CPUCachedBlocks)
			require.Positive(t, st.CPUCacheHits)
			require.Positive(t, st.Preemptions)
			require.Positive(t, st.PrefixCacheHits)
		})
	}
}

func TestPrefixCachingDisabled(t *testing.T) {
	h := newHarness(t, Config{BlockSize: 4, NumGPUBlocks: 16, DisablePrefixCaching: true})
	h.complete("a", seq(1, 10), seq(100, 3))
	ups := h.complete("b", seq(1, 10), seq(100, 3))
	require.Zero(t, ups[0].CachedTokens)
	require.Empty(t, h.sink.events())
	require.Empty(t, h.e.Resident())
	st := h.e.Snapshot()
	require.Zero(t, st.PrefixCacheQueries)
	require.Zero(t, st.UsedBlocks)
	info := gather(t, h.e)["vllm:cache_config_info"].GetMetric()[0]
	require.Equal(t, "False", labelsOf(info)["enable_prefix_caching"])
	require.Equal(t, "None", labelsOf(info)["num_cpu_blocks"])
}

func TestSGLangSeparatesPrefillAndDecode(t *testing.T) {
	h := newHarness(t, Config{Flavour: FlavourSGLang, BlockSize: 16, NumGPUBlocks: 64, MaxNumBatchedTokens: 64})
	a := h.submit("a", seq(1, 40), seq(100, 4))
	steps := []struct{ prefill, decode int }{}
	record := func() {
		p := h.e.step()
		steps = append(steps, struct{ prefill, decode int }{p.prefillTokens, p.decodeSeqs})
		h.e.commit(p)
	}
	record() // prefill a
	record() // decode a
	b := h.submit("b", seq(1000, 100), seq(200, 2))
	record() // prefill b (first chunk): a's decode waits
	record() // prefill b (rest)
	record() // decode a and b
	require.Equal(t, []struct{ prefill, decode int }{{40, 0}, {0, 1}, {64, 0}, {36, 0}, {0, 2}}, steps)
	h.runIdle()
	drain(t, a)
	drain(t, b)
}

// FuzzScheduler runs arbitrary small workloads against a tiny cache and
// checks the engine's invariants: no panic, every request ends with all its
// tokens, no block stays referenced, and the events replay to the resident set.
func FuzzScheduler(f *testing.F) {
	f.Add([]byte{8, 3, 1, 20, 5, 2, 0, 9, 9}, uint8(4), uint8(12), false)
	f.Add([]byte{40, 30, 0, 1, 1, 1, 250, 7}, uint8(1), uint8(50), true)
	f.Add([]byte{3, 200, 2, 3, 4, 100, 100, 100}, uint8(16), uint8(8), false)
	f.Fuzz(func(t *testing.T, data []byte, bs, blocks uint8, sglang bool) {
		// vLLM needs a block besides its null block (TestConfigValidate).
		if bs == 0 || bs > 32 || blocks == 0 || blocks > 64 || blocks == 1 && !sglang {
			return
		}
		flavour := FlavourVLLM
		if sglang {
			flavour = FlavourSGLang
		}
		h := newHarness(t, Config{Flavour: flavour, BlockSize: int(bs), NumGPUBlocks: int(blocks), NumCPUBlocks: int(blocks) / 2,
			MaxNumBatchedTokens: 24, MaxNumSeqs: 4})
		var chans []<-chan Update
		var want []int
		for i := 0; i+2 < len(data) && i < 60; i += 3 {
			prompt := seq(int(data[i]%4)*1000, 1+int(data[i+1]))
			out := seq(0, 1+int(data[i+2]%40))
			ch, err := h.e.Submit(context.Background(), &Request{ID: fmt.Sprint(i), Prompt: prompt, Output: out})
			if err != nil {
				require.ErrorContains(t, err, "KV blocks")
				continue
			}
			chans = append(chans, ch)
			want = append(want, len(out))
			h.step()
		}
		h.runIdle()
		for i, ch := range chans {
			ups := drain(t, ch)
			require.Equal(t, want[i], ups[len(ups)-1].Generated)
		}
		require.Zero(t, h.e.Snapshot().UsedBlocks)
		require.Equal(t, residentSet(h.e.Resident()), replay(t, h.sink.events(), int(bs)))
	})
}
