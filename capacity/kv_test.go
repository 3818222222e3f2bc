package capacity

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBoundKV(t *testing.T) {
	// 100 requests of 900 new prompt tokens and 100 output: 1,000 KV
	// tokens a request.
	mix := Prefill{Requests: 100, NewTokens: 90_000, OutputTokens: 10_000}
	at := AtObjectives{Concurrency: 12, Streams: 20, OutputTokensPerSec: 600, PromptTokensPerSec: 6_000, Limit: LimitITL}
	for _, tc := range []struct {
		name        string
		busy        float64
		free, total int64
		mix         Prefill
		want        AtObjectives
	}{
		{"room for more than sold", 0, 50_000, 50_000, mix,
			AtObjectives{Concurrency: 12, Streams: 20, OutputTokensPerSec: 600, PromptTokensPerSec: 6_000, Limit: LimitITL, KVBoundStreams: 50}},
		{"streams bounded, the rate not", 4, 12_000, 50_000, mix,
			AtObjectives{Concurrency: 12, Streams: 16, OutputTokensPerSec: 600, PromptTokensPerSec: 6_000, Limit: LimitITL, KVBoundStreams: 16}},
		{"both bounded, the rates scaled with the capacity", 4, 2_000, 50_000, mix,
			AtObjectives{Concurrency: 6, Streams: 6, OutputTokensPerSec: 300, PromptTokensPerSec: 3_000, Limit: LimitKV, KVBoundStreams: 6}},
		{"a full cache leaves the busy requests", 3, 0, 50_000, mix,
			AtObjectives{Concurrency: 3, Streams: 3, OutputTokensPerSec: 150, PromptTokensPerSec: 1_500, Limit: LimitKV, KVBoundStreams: 3}},
		{"mix not measured", 4, 2_000, 50_000, Prefill{Requests: MinRequests - 1, NewTokens: 1_000}, at},
		{"mix of no tokens", 4, 2_000, 50_000, Prefill{Requests: 100}, at},
		{"cache size unknown", 4, 2_000, 0, mix, at},
		{"negative free (a bad scrape)", 4, -1, 50_000, mix, at},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := at
			got.BoundKV(tc.busy, tc.free, tc.total, tc.mix)
			require.InDeltaMapValues(t, toMap(tc.want), toMap(got), 1e-9)
			require.Equal(t, tc.want.Limit, got.Limit)
		})
	}
}

func toMap(a AtObjectives) map[string]float64 {
	return map[string]float64{"concurrency": a.Concurrency, "streams": a.Streams, "output": a.OutputTokensPerSec,
		"prompt": a.PromptTokensPerSec, "kv": a.KVBoundStreams}
}

// A request's prompt tokens the prefix cache already holds are shared
// with whatever holds them: a mix of 1,200-token prompts of which 1,000
// are cached takes 200 new tokens and its output a request, not 1,300.
func TestKVTokensPerRequest(t *testing.T) {
	for _, tc := range []struct {
		name string
		mix  Prefill
		want float64
		ok   bool
	}{
		{"shared prefixes are not counted", Prefill{Requests: 100, NewTokens: 20_000, OutputTokens: 10_000}, 300, true},
		{"every prompt new", Prefill{Requests: 100, NewTokens: 120_000, OutputTokens: 10_000}, 1_300, true},
		{"too few requests", Prefill{Requests: MinRequests - 1, NewTokens: 20_000, OutputTokens: 10_000}, 0, false},
		{"no tokens", Prefill{Requests: 100}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tc.mix.KVTokensPerRequest()
			require.Equal(t, tc.ok, ok)
			require.InDelta(t, tc.want, got, 1e-9)
		})
	}
}
