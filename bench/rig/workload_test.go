package rig

import (
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/tokenizer"
)

func TestParseTrace(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    int
		wantErr string
	}{
		{"two records and a blank line", `{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}

{"timestamp": 5, "input_length": 512, "output_length": 1, "hash_ids": [1]}
`, 2, ""},
		{"too few hash ids", `{"timestamp": 0, "input_length": 1025, "output_length": 3, "hash_ids": [1, 2]}`, 0, "needs 3 hash ids"},
		{"zero output", `{"timestamp": 0, "input_length": 10, "output_length": 0, "hash_ids": [1]}`, 0, "output_length"},
		{"not json", `{"timestamp": `, 0, "line 1"},
		{"empty", "\n\n", 0, "no records"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			recs, err := ParseTrace(strings.NewReader(tc.in))
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Len(t, recs, tc.want)
		})
	}
}

func TestTraceTokens(t *testing.T) {
	a := TraceRecord{InputLength: 512*2 + 100, OutputLength: 1, HashIDs: []int64{7, 8, 9}}
	b := TraceRecord{InputLength: 512 + 30, OutputLength: 1, HashIDs: []int64{7, 9}}
	ta, tb := TraceTokens(3, a), TraceTokens(3, b)
	require.Len(t, ta, a.InputLength)
	require.Len(t, tb, b.InputLength)
	// Equal hash ids give equal blocks, wherever they sit.
	require.Equal(t, ta[:512], tb[:512])
	// A partial block is a prefix of the same id's tokens.
	require.Equal(t, ta[1024:1054], tb[512:542])
	// Different ids and different seeds give different blocks.
	require.NotEqual(t, ta[:512], ta[512:1024])
	require.NotEqual(t, ta[:512], TraceTokens(4, a)[:512])
	for _, id := range ta {
		require.Less(t, id, uint32(standInVocab))
	}
	// The text form is one stand-in token per word, the same shape.
	tok := tokenizer.NewStandIn()
	txa := tok.Encode(nil, TraceText(3, a))
	txb := tok.Encode(nil, TraceText(3, b))
	require.Len(t, txa, a.InputLength)
	require.Equal(t, txa[:512], txb[:512])
	require.Equal(t, txa[1024:1054], txb[512:542])
}

func TestTraceBound(t *testing.T) {
	recs := []TraceRecord{
		// 1000 tokens: blocks 1 (512), 2 (488). Nothing seen: 0 hits.
		{InputLength: 1000, OutputLength: 1, HashIDs: []int64{1, 2}},
		// 1024 tokens: block 1 hits 512; block 2 is full (512) but only 488
		// of it were seen under id 2: 488 hits.
		{InputLength: 1024, OutputLength: 1, HashIDs: []int64{1, 2}},
		// 300 tokens: block 1 partial, 300 hits.
		{InputLength: 300, OutputLength: 1, HashIDs: []int64{1}},
		// 600 tokens: block 3 new (512), block 2 partial 88 <= 512 seen: 88 hits.
		{InputLength: 600, OutputLength: 1, HashIDs: []int64{3, 2}},
	}
	hits := 0.0 + 512 + 488 + 300 + 88
	total := 1000.0 + 1024 + 300 + 600
	require.InDelta(t, hits/total, TraceBound(recs), 1e-12)
	require.Equal(t, 0.0, TraceBound(recs[:1]))
}

func TestPoissonLadderDeterministic(t *testing.T) {
	qps := []float64{5, 20}
	durs := []time.Duration{10 * time.Second, 10 * time.Second}
	a, sa := PoissonLadder(7, qps, durs, 2)
	b, sb := PoissonLadder(7, qps, durs, 2)
	c, _ := PoissonLadder(8, qps, durs, 2)
	require.Equal(t, a, b)
	require.Equal(t, sa, sb)
	require.NotEqual(t, a, c)
	require.Len(t, sa, 2)
	// Stages are 10 model seconds = 5 wall seconds at time scale 2.
	require.Equal(t, Stage{QPS: 5, Start: 0, End: 5 * time.Second}, sa[0])
	require.Equal(t, Stage{QPS: 20, Start: 5 * time.Second, End: 10 * time.Second}, sa[1])
	for i, at := range a {
		require.NotEmpty(t, at)
		for j, x := range at {
			require.GreaterOrEqual(t, x, sa[i].Start)
			require.Less(t, x, sa[i].End)
			if j > 0 {
				require.GreaterOrEqual(t, x, at[j-1])
			}
		}
	}
	// Counts follow the rates: 50 and 200 expected, well within 5 sigma.
	require.InDelta(t, 50, len(a[0]), 5*math.Sqrt(50))
	require.InDelta(t, 200, len(a[1]), 5*math.Sqrt(200))

	// Stages of their own lengths follow one another.
	_, sv := PoissonLadder(7, qps, []time.Duration{4 * time.Second, 30 * time.Second}, 2)
	require.Equal(t, Stage{QPS: 5, Start: 0, End: 2 * time.Second}, sv[0])
	require.Equal(t, Stage{QPS: 20, Start: 2 * time.Second, End: 17 * time.Second}, sv[1])
}

// TestCountedLadderOffersItsRate: every stage sends exactly round(qps ×
// duration) requests, inside the stage, in order, spread over it, for any
// seed; 39,595 is a seed whose Poisson draws leave one arrival in 5 s at 2
// requests a second.
func TestCountedLadderOffersItsRate(t *testing.T) {
	qps := []float64{2, 20, 0.1}
	durs := []time.Duration{5 * time.Second, 10 * time.Second, 5 * time.Second}
	poisson, _ := PoissonLadder(5*7919, qps[:1], durs[:1], 1)
	require.Len(t, poisson[0], 1)
	for _, seed := range []int64{1, 7, 5 * 7919} {
		a, sa := CountedLadder(seed, qps, durs, 2)
		b, _ := CountedLadder(seed, qps, durs, 2)
		require.Equal(t, a, b)
		_, sp := PoissonLadder(seed, qps, durs, 2)
		require.Equal(t, sp, sa)
		for i, want := range []int{10, 200, 1} {
			require.Len(t, a[i], want, "stage %d", i)
			require.True(t, slices.IsSorted(a[i]))
			for _, x := range a[i] {
				require.GreaterOrEqual(t, x, sa[i].Start)
				require.Less(t, x, sa[i].End)
			}
		}
		// 200 uniform arrivals: each half of the stage gets 100 ± 5 sigma.
		mid := sa[1].Start + (sa[1].End-sa[1].Start)/2
		first, _ := slices.BinarySearch(a[1], mid)
		require.InDelta(t, 100, first, 5*math.Sqrt(50))
	}
	c, _ := CountedLadder(8, qps, durs, 2)
	a, _ := CountedLadder(7, qps, durs, 2)
	require.NotEqual(t, a, c)
}

func TestSharedPrefixWorkload(t *testing.T) {
	o := Options{Workload: WorkloadOptions{Kind: WorkloadSharedPrefix, SharedPrefix: SharedPrefixOptions{
		NumGroups: 3, PromptsPerGroup: 2, SystemPromptLen: 40, QuestionLen: 10, OutputLen: 5,
		QPS: []float64{50}, StageDuration: 2 * time.Second}}}.WithDefaults()
	w, err := BuildWorkload(o)
	require.NoError(t, err)
	w2, err := BuildWorkload(o)
	require.NoError(t, err)
	require.Equal(t, w.Requests, w2.Requests)
	require.NotEmpty(t, w.Requests)
	tok := tokenizer.NewStandIn()
	// Recompute the bound from the prompts themselves: a request hits its
	// whole prompt if seen before, else its first 40 tokens if a prompt with
	// the same first 40 tokens was.
	seenFull, seenSys := map[string]bool{}, map[string]bool{}
	var hits, total float64
	for _, r := range w.Requests {
		ids := tok.Encode(nil, r.Text)
		require.Len(t, ids, 50)
		require.Equal(t, 5, r.MaxTokens)
		sys := strings.Join(strings.Fields(r.Text)[:40], " ")
		total += 50
		switch {
		case seenFull[r.Text]:
			hits += 50
		case seenSys[sys]:
			hits += 40
		}
		seenFull[r.Text], seenSys[sys] = true, true
	}
	require.LessOrEqual(t, len(seenSys), 3)
	require.InDelta(t, hits/total, w.Bound, 1e-12)
}

func BenchmarkTraceTokens(b *testing.B) {
	r := TraceRecord{InputLength: 15300, OutputLength: 149, HashIDs: make([]int64, 30)}
	for i := range r.HashIDs {
		r.HashIDs[i] = int64(i)
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_ = TraceTokens(1, r)
	}
	b.ReportMetric(float64(b.N)*float64(r.InputLength)/b.Elapsed().Seconds()/1e6, "Mtokens/s")
}

func TestValidateOptions(t *testing.T) {
	tests := []struct {
		name    string
		mod     func(o *Options)
		wantErr string
	}{
		{"defaults", func(o *Options) {}, ""},
		{"fleet mode", func(o *Options) { o.Fleet.Mode = "cloud" }, "fleet mode"},
		{"urls without urls", func(o *Options) { o.Fleet.Mode = FleetURLs }, "at least one URL"},
		{"urls and an endpoint file", func(o *Options) {
			o.Fleet.Mode, o.Fleet.URLs, o.Fleet.EndpointsFile = FleetURLs, []string{"http://127.0.0.1:1"}, "e.yaml"
		}, "not both"},
		{"running engines' tokenizer", func(o *Options) {
			o.Fleet.Mode, o.Fleet.URLs, o.Fleet.Engines.Tokenizer = FleetURLs, []string{"http://127.0.0.1:1"}, "/nonexistent"
		}, "tokenizer.json"},
		{"replicas", func(o *Options) { o.Fleet.Replicas = 100 }, "replicas"},
		{"time scale", func(o *Options) { o.Fleet.TimeScale = -1 }, "time scale"},
		{"trace path", func(o *Options) { o.Workload.Kind = WorkloadTrace }, "trace path"},
		{"qps", func(o *Options) { o.Workload.SharedPrefix.QPS = []float64{1, 0} }, "QPS 0"},
		{"chat", func(o *Options) { o.Workload.Kind = WorkloadChat; o.Workload.Chat.SessionRate = -1 }, "chat"},
		{"workload", func(o *Options) { o.Workload.Kind = "mystery" }, "workload"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{}
			tc.mod(&o)
			err := o.WithDefaults().Validate()
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestLRUBound(t *testing.T) {
	a, b, c := piece{1, 100}, piece{2, 100}, piece{3, 50}
	reqs := [][]piece{{a}, {b}, {a}, {c}, {b}, {a}}
	// Infinite: a, b, c miss once each; a, b, a hit: 300 of 550.
	require.InDelta(t, 300.0/550, lruBound(reqs, 1<<40), 1e-12)
	// Room for 200 tokens: a b | a hit | c evicts b (LRU) | b misses,
	// evicts a | a misses: only one hit.
	require.InDelta(t, 100.0/550, lruBound(reqs, 200), 1e-12)
	// Room for nothing: no hits.
	require.Equal(t, 0.0, lruBound(reqs, 0))
	// A partial piece hits only what was cached under its key.
	require.InDelta(t, 40.0/140, lruBound([][]piece{{{9, 40}}, {{9, 100}}}, 1000), 1e-12)

	// With unlimited room the trace and shared-prefix fleet bounds are the
	// infinite-cache bounds.
	o := Options{Workload: WorkloadOptions{SharedPrefix: SharedPrefixOptions{QPS: []float64{30}}}}.WithDefaults()
	w, err := BuildWorkload(o)
	require.NoError(t, err)
	require.InDelta(t, w.Bound, w.LRUBound(1<<40), 1e-12)
	require.Less(t, w.LRUBound(3000), w.Bound)
	dir := t.TempDir()
	path := dir + "/t.jsonl"
	require.NoError(t, os.WriteFile(path, []byte(`{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}
{"timestamp": 9, "input_length": 1024, "output_length": 3, "hash_ids": [1, 2]}`), 0o644))
	o = Options{Workload: WorkloadOptions{Kind: WorkloadTrace, Trace: TraceOptions{Path: path}}}.WithDefaults()
	w, err = BuildWorkload(o)
	require.NoError(t, err)
	require.InDelta(t, w.Bound, w.LRUBound(1<<40), 1e-12)
	require.InDelta(t, (512.0+88)/1624, w.Bound, 1e-12)
	require.True(t, math.IsNaN((&Workload{}).LRUBound(10)))
}

func TestSharedPrefixOrder(t *testing.T) {
	base := SharedPrefixOptions{NumGroups: 10, PromptsPerGroup: 3, SystemPromptLen: 4, QuestionLen: 2, OutputLen: 1,
		QPS: []float64{200}, StageDuration: 10 * time.Second}
	groupsOf := func(sp SharedPrefixOptions) []int {
		o := Options{Workload: WorkloadOptions{Kind: WorkloadSharedPrefix, SharedPrefix: sp}}.WithDefaults()
		require.NoError(t, o.Validate())
		w, err := BuildWorkload(o)
		require.NoError(t, err)
		var g []int
		for _, p := range w.pieces {
			g = append(g, int(p[0].key>>1))
		}
		return g
	}

	// Zipf: group g drawn with weight 1/(g+1); over ~2,000 draws group 0
	// comes about 10/H(10) = 3.4 times as often as the uniform tenth.
	sp := base
	sp.GroupSkew = 1
	counts := make([]int, 10)
	gs := groupsOf(sp)
	for _, g := range gs {
		counts[g]++
	}
	require.InDelta(t, 1/2.929, float64(counts[0])/float64(len(gs)), 0.04)
	require.Greater(t, counts[0], counts[4])
	require.Greater(t, counts[4], 0)

	// Cycle: every prompt once per round of 30, in one shuffled order.
	sp = base
	sp.Cycle = true
	o := Options{Workload: WorkloadOptions{Kind: WorkloadSharedPrefix, SharedPrefix: sp}}.WithDefaults()
	w, err := BuildWorkload(o)
	require.NoError(t, err)
	seen := map[uint64]bool{}
	for i := range 30 {
		seen[w.pieces[i][1].key] = true
		require.Equal(t, w.pieces[i][1].key, w.pieces[i+30][1].key)
	}
	require.Len(t, seen, 30)
}
