package scheduler

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/internal/testutil/conftest"
)

func TestDefaultConfig(t *testing.T) {
	c := DefaultConfig()
	require.NoError(t, c.Validate())
	require.Equal(t, PolicyPrecise, c.Policy)
	require.Equal(t, 16, c.BlockSize)
	require.Equal(t, 2, *c.Fallbacks)
	require.Equal(t, 2*time.Second, *c.Prefix.SpeculativeTTL)
	require.Equal(t, 0.3, *c.Prefix.MatchRatio)
	require.Equal(t, 4.0, *c.Prefix.BalanceAbs)
	require.Equal(t, 1.25, c.Prefix.BalanceRel)
	require.Equal(t, 3, c.Breaker.FailureThreshold)
	require.Equal(t, 15*time.Second, c.Breaker.Cooldown)
	require.Equal(t, 4.0, c.Scoring.TargetWaiting)
	require.Equal(t, 8.0, c.Scoring.TargetInflight)
	require.Equal(t, 0.9, c.Scoring.KVCeiling)
	require.Equal(t, 1.25, c.Scoring.SessionLoadFactor)
	require.Len(t, c.Admission.Bands, 4)
	require.Equal(t, Band{"bronze", 100, 0.30}, c.Admission.Bands[3])
	require.Equal(t, 30*time.Second, c.Admission.QueueTTL)
	require.Equal(t, 256.0, c.Admission.TargetInflight)
	require.Equal(t, 2000, *c.Admission.QueueCapacityPerBand)
	require.Equal(t, 10*time.Millisecond, c.Admission.Interval)
	require.True(t, *c.Admission.Enabled)
}

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig([]byte(`
policy: approximate
block_size: 32
prefix:
  min_match: 128
  balance_abs: 4
scoring:
  weights: {prefix: 5, kv: 0}
breaker: {cooldown: 30s}
admission:
  enabled: false
  default_band: hi
  bands:
    - {name: hi, priority: 2, saturation_ceiling: 2}
    - {name: lo, priority: 1, saturation_ceiling: 0.5}
`))
	require.NoError(t, err)
	require.Equal(t, PolicyApproximate, c.Policy)
	require.Equal(t, 32, c.BlockSize)
	require.Equal(t, 128, *c.Prefix.MinMatch)
	require.Equal(t, 4.0, *c.Prefix.BalanceAbs)
	require.Equal(t, 1.25, c.Prefix.BalanceRel, "unset fields keep defaults")
	require.Equal(t, 5.0, *c.Scoring.Weights.Prefix)
	require.Equal(t, 0.0, *c.Scoring.Weights.KV, "an explicit zero weight disables a scorer")
	require.Equal(t, 1.0, *c.Scoring.Weights.Queue)
	require.Equal(t, 30*time.Second, c.Breaker.Cooldown)
	require.False(t, *c.Admission.Enabled)
	require.Len(t, c.Admission.Bands, 2)

	c, err = ParseConfig(nil)
	require.NoError(t, err, "an empty document is the defaults")
	require.Equal(t, DefaultConfig().BlockSize, c.BlockSize)
}

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"unknown field", "polcy: random", "field polcy not found"},
		{"bad policy", "policy: smart", `policy "smart"`},
		{"bad duration", "breaker: {cooldown: soon}", "cannot parse"},
		{"negative weight", "scoring: {weights: {queue: -1}}", "scoring.weights.queue"},
		{"match ratio", "prefix: {match_ratio: 1.5}", "prefix.match_ratio"},
		{"balance rel", "prefix: {balance_rel: 0.5}", "prefix.balance_rel"},
		{"kv ceiling", "scoring: {kv_ceiling: 1.2}", "scoring.kv_ceiling"},
		{"default band missing", "admission: {default_band: vip}", `default_band "vip"`},
		{"negative admission target", "admission: {target_inflight: -1}", "admission.target_inflight -1"},
		{"duplicate band", "admission: {default_band: a, bands: [{name: a, saturation_ceiling: 1}, {name: a, saturation_ceiling: 1}]}", "appears twice"},
		{"stale before interval", "signals: {scrape_interval: 5s, stale_after: 1s}", "signals.stale_after"},
		{"fallbacks", "fallbacks: -1", "fallbacks -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tt.yaml))
			require.Error(t, err)
			require.True(t, strings.Contains(err.Error(), tt.want), "error %q lacks %q", err, tt.want)
		})
	}
	_, err := New(Config{Policy: "bogus"}, nil, nil, nil)
	require.ErrorContains(t, err, "invalid scheduler config")
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("policy: random\nfallbacks: 3\n"))
	f.Add([]byte("admission: {bands: [{name: a, priority: 1, saturation_ceiling: 0.5}], default_band: a}"))
	f.Add([]byte("scoring: {weights: {prefix: 2}}\nprefix: {ttl: 1m}"))
	f.Add([]byte("{"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("ParseConfig accepted an invalid config: %v", err)
		}
		if _, err := New(c, nil, nil, nil); err != nil {
			t.Fatalf("New rejected a parsed config: %v", err)
		}
	})
}

// TestZeroIsASetting: every key whose zero is legal keeps an explicit zero
// instead of taking its default.
func TestZeroIsASetting(t *testing.T) {
	for _, key := range []string{
		"fallbacks", "seed",
		"signals.scrape_failures_trip",
		"prefix.min_match", "prefix.min_match_bytes", "prefix.match_ratio", "prefix.balance_abs",
		"prefix.speculative_ttl", "prefix.cpu_weight", "prefix.storage_weight",
		"scoring.session_ttl", "scoring.stale_factor", "scoring.temperature",
		"scoring.weights.prefix", "scoring.weights.queue", "scoring.weights.inflight",
		"scoring.weights.kv", "scoring.weights.session", "scoring.weights.lora",
		"admission.enabled", "admission.queue_capacity_per_band",
	} {
		t.Run(key, func(t *testing.T) {
			doc := conftest.ZeroYAML(key, conftest.Lookup(t, conftest.Fields(DefaultConfig()), key))
			c, err := ParseConfig([]byte(doc))
			require.NoError(t, err, doc)
			require.True(t, conftest.IsZero(conftest.Lookup(t, conftest.Fields(c), key)), "%s after defaults", doc)
		})
	}
}
