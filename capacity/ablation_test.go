package capacity

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/metrics"
)

// updateAblation re-learns the ablation's replicas from the recorded
// ladders:
//
//	go test ./capacity/ -run TestAblation -update-ablation
var updateAblation = flag.Bool("update-ablation", false, "re-learn testdata/*-replica.json from testdata/*-ladder.txt.gz")

// ablationDecode and ablationPrefill are the recorded ladders (scheduler's
// TestRecordedSeries records them from the engine simulator, in vLLM's
// metric names) the ablation reads a replica of: the decode ladder's
// batch grows to 64 with short prompts (1,000 tokens, 100 out), the
// prefill ladder's long prompts (8,000 tokens, 4 out) make prefill the
// bottleneck from 8 clients on.
const ablationDecode, ablationPrefill = "vllm-ladder", "vllm-prefill-ladder"

// ablationHalfLife is the EPP's default capacity half-life.
const ablationHalfLife = 30 * time.Minute

// learnLadder feeds a recorded ladder's scrapes through a Learner as the
// EPP does (scheduler's replica.learn, for an engine no other replica
// shares) and returns the replica at the last scrape: its curve, load
// and KV cache.
func learnLadder(t *testing.T, path string) Replica {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	require.NoError(t, err)
	data, err := io.ReadAll(zr)
	require.NoError(t, err)
	l := NewLearner(ablationHalfLife)
	var prev, next *metrics.Sample
	var text []byte
	learn := func() {
		if next == nil {
			return
		}
		require.NoError(t, metrics.Parse(text, &next.Signals))
		if prev != nil {
			next.DeriveFrom(prev)
			w := &next.Window
			newTokens := next.PromptTokensPerSec
			if next.Signals.Has&metrics.HasPrefixQueries != 0 {
				newTokens = max(next.PrefixQueriesPerSec-next.PrefixHitsPerSec, 0)
			}
			hist := func(h *metrics.Histogram) ([]float64, Histogram) {
				return append([]float64(nil), h.Bounds[:h.N]...),
					Histogram{Counts: append([]float64(nil), h.Counts[:h.N]...), Count: h.Count, Sum: h.Sum}
			}
			cw := Window{Seconds: w.Seconds, Running: w.Running, ConcurrencyNow: next.Signals.Running + next.Signals.Waiting,
				Waiting: w.Waiting, WaitingMin: w.WaitingMin, KVUsage: w.KVUsage,
				OutputTokensPerSec: next.GenerationTokensPerSec, PromptTokensPerSec: next.PromptTokensPerSec,
				NewPromptTokensPerSec: newTokens, FirstTokens: w.TTFT.Count}
			cw.TTFTBounds, cw.TTFT = hist(&w.TTFT)
			cw.ITLBounds, cw.ITL = hist(&w.ITL)
			l.Add(cw)
		}
		prev, text = next, nil
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if ns, ok := strings.CutPrefix(line, "# AT "); ok {
			learn()
			v, err := strconv.ParseInt(ns, 10, 64)
			require.NoError(t, err)
			next = &metrics.Sample{At: time.Unix(0, v)}
			continue
		}
		text = append(append(text, line...), '\n')
	}
	require.NoError(t, sc.Err())
	learn()
	s := &prev.Signals
	total := s.KVCapacityTokens()
	return Replica{Addr: path, Healthy: true, Running: int(s.Running), Waiting: int(s.Waiting),
		OutputTokensPerSec: l.OutputRate(), Load: l.Load(),
		FreeKVTokens: int64(float64(total) * (1 - s.KVUsage)), TotalKVTokens: total, Curve: l.Curve()}
}

// ablationReplica is the replica learnt from a ladder, saved as JSON
// under testdata, learnt anew first under -update-ablation.
func ablationReplica(t *testing.T, ladder string) Replica {
	path := "testdata/" + ladder + "-replica.json"
	if *updateAblation {
		r := learnLadder(t, "testdata/"+ladder+".txt.gz")
		data, err := json.MarshalIndent(r, "", " ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, append(data, '\n'), 0o644))
	}
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var r Replica
	require.NoError(t, json.Unmarshal(data, &r))
	require.NoError(t, r.Curve.Validate())
	return r
}

// ablated is what the ablation reads of a replica: its capacity and the
// headroom an idle replica quotes (ComputeHeadroom: the streams and the
// output rate), and what bounds it.
type ablated struct {
	Concurrency, OutputTokensPerSec, Streams float64
	Limit                                    string
}

// ablationBounds names each bound the ablation switches off, as Limit
// names it; "held" (the load held at the rate read) names none, and "kv"
// is BoundKV, which the caller applies after the reading.
var ablationBounds = []struct {
	name  string
	bound bound
}{
	{LimitTTFT, boundTTFT}, {LimitITL, boundITL}, {LimitMeasured, boundMeasured}, {LimitPrefill, boundPrefill},
	{LimitStall, boundStall}, {LimitAdmission, boundAdmission}, {"held", boundHeld}, {LimitKV, 0},
}

// ablationAdmission is the EPP's default flow control (target_waiting 4,
// kv_ceiling 0.9, the gold band's ceiling 0.85) over a pool of 4.
var (
	ablationAdmission = Admission{TargetWaiting: 4, KVCeiling: 0.9, Ceiling: 0.85}
	ablationPool      = 4
)

// ablate reads r as a quote does (ComputeHeadroom, less max_running): the
// curve at o under flow control, then its KV cache, with the bound named
// off switched off ("" for none).
func ablate(t *testing.T, r Replica, o Objectives, off string) ablated {
	rd := reading{}
	kv := true
	for _, b := range ablationBounds {
		switch {
		case b.name != off:
		case b.name == LimitKV:
			kv = false
		default:
			rd.off |= 1 << b.bound
		}
	}
	adm := ablationAdmission
	at, err := rd.at(r.Curve, o, &adm, ablationPool)
	require.NoError(t, err)
	if kv {
		at.BoundKV(r.Load, r.FreeKVTokens, r.TotalKVTokens, r.Curve.Prefill)
	}
	return ablated{at.Concurrency, at.OutputTokensPerSec, at.Streams, at.Limit}
}

// TestAblation switches each bound of a reading off in turn over replicas
// learnt from recorded ladders and checks what it earns: the capacity
// with every bound on and with that one off, to 1e-9 relative. The
// figures are the reading's own, from running it once (go test
// ./capacity/ -run TestAblation -v logs them); a change in any bound's
// effect fails here.
//
// A bound lowers the headroom (the streams and the output rate) or
// leaves it, with one exception the table lists in lowers: the KV bound
// caps the concurrency and scales the rate with it, so what lowers the
// concurrency alone (the held load, the ITL objective's spread) leaves
// each request more of the rate and the KV bound more tokens per second.
// Concurrency itself may fall with a bound off: the held load is read
// from the spans within the concurrency it bounds (Curve.heldAt), and a
// larger one admits spans that read a lighter load.
func TestAblation(t *testing.T) {
	loose := Objectives{TTFT: 2 * time.Second, ITL: time.Second, Quantile: 0.95}
	patient := Objectives{TTFT: 30 * time.Second, ITL: 200 * time.Millisecond, Quantile: 0.95}
	decode, prefill := ablationReplica(t, ablationDecode), ablationReplica(t, ablationPrefill)
	// full is the decode replica idle with room in its cache for two of
	// the mix's requests: what the KV bound guards against. The recorded
	// replicas' caches (281,600 tokens) never bind.
	full := decode
	per, ok := full.Curve.Prefill.KVTokensPerRequest()
	require.True(t, ok)
	full.Load, full.FreeKVTokens = 0, int64(2*per)
	for _, tc := range []struct {
		name    string
		replica Replica
		o       Objectives
		all     ablated
		off     map[string]ablated // by bound; a bound not listed earns nothing here
		lowers  []string           // bounds whose switching off lowers the headroom
	}{
		{name: "decode ladder, default objectives", replica: decode, o: DefaultObjectives,
			all: ablated{4.25695086084, 309.997141372, 5.9020333508, LimitStall},
			off: map[string]ablated{
				LimitITL:   {4.40780362769, 309.997141372, 63.4409805902, LimitStall},
				LimitStall: {4.59400302442, 334.541753376, 5.9020333508, LimitITL},
				"held":     {4.57201787635, 309.997141372, 5.9020333508, LimitStall},
			}},
		{name: "decode ladder, ITL 1s", replica: decode, o: loose,
			all: ablated{34.1591683697, 932.113844709, 63.4409805902, LimitMeasured},
			off: map[string]ablated{
				LimitMeasured: {35.9689773766, 981.49877157, 63.4409805902, LimitMeasured},
				"held":        {50.5237579798, 932.113844709, 63.4409805902, LimitMeasured},
			}},
		{name: "prefill ladder, default objectives", replica: prefill, o: DefaultObjectives,
			all: ablated{0.23908184626, 1.77310363397, 1.32730054034, LimitPrefill},
			off: map[string]ablated{
				LimitITL:     {0.247503320871, 1.77310363397, 1.37280136179, LimitPrefill},
				LimitPrefill: {0.327250570871, 2.42698969206, 1.32730054034, LimitITL},
			}},
		{name: "prefill ladder, ITL 1s", replica: prefill, o: loose,
			all: ablated{0.247503320871, 1.77310363397, 1.37280136179, LimitPrefill},
			off: map[string]ablated{
				LimitTTFT:    {0.23556706429, 1.77310363397, 6.7619361936, LimitPrefill},
				LimitPrefill: {0.982950876768, 7.28938350351, 1.37280136179, LimitTTFT},
			}},
		{name: "prefill ladder, TTFT 30s ITL 200ms", replica: prefill, o: patient,
			all: ablated{0.327250570871, 2.42698969206, 1.32730054034, LimitITL},
			off: map[string]ablated{
				LimitITL: {0.86573597231, 6.51635916586, 6.7619361936, LimitAdmission},
			}},
		{name: "decode ladder idle, cache room for 2", replica: full, o: DefaultObjectives,
			all: ablated{1.9997669188, 145.625836074, 1.9997669188, LimitKV},
			off: map[string]ablated{
				LimitITL: {1.9997669188, 140.641934306, 1.9997669188, LimitKV},
				"held":   {1.9997669188, 135.590464649, 1.9997669188, LimitKV},
				LimitKV:  {4.25695086084, 309.997141372, 5.9020333508, LimitStall},
			},
			lowers: []string{LimitITL, "held"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			all := ablate(t, tc.replica, tc.o, "")
			t.Logf("all on: %s", all)
			requireAblated(t, tc.all, all, "all on")
			for _, b := range ablationBounds {
				got := ablate(t, tc.replica, tc.o, b.name)
				want, ok := tc.off[b.name]
				if !ok {
					want = tc.all
				} else {
					t.Logf("%s off: %s", b.name, got)
				}
				requireAblated(t, want, got, "%s off", b.name)
				lower := got.Streams < all.Streams || got.OutputTokensPerSec < all.OutputTokensPerSec
				require.Equal(t, slices.Contains(tc.lowers, b.name), lower, "%s off lowers the headroom", b.name)
			}
		})
	}
}

// requireAblated requires got to be want, its figures to 1e-9 relative.
func requireAblated(t *testing.T, want, got ablated, msg string, args ...any) {
	t.Helper()
	for _, f := range []struct {
		name      string
		want, got float64
	}{
		{"concurrency", want.Concurrency, got.Concurrency},
		{"output tokens/s", want.OutputTokensPerSec, got.OutputTokensPerSec},
		{"streams", want.Streams, got.Streams},
	} {
		require.InEpsilon(t, f.want, f.got, 1e-9, "%s: %s", fmt.Sprintf(msg, args...), f.name)
	}
	require.Equal(t, want.Limit, got.Limit, "%s: limit", fmt.Sprintf(msg, args...))
}

func (a ablated) String() string {
	return fmt.Sprintf("{%.12g, %.12g, %.12g, %q}", a.Concurrency, a.OutputTokensPerSec, a.Streams, a.Limit)
}
