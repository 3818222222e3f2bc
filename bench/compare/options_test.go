package compare

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/bench/rig"
)

func TestPresets(t *testing.T) {
	// Distinct prompt tokens over the fleet's KV cache: llmd-73 fills 73%
	// of it as published; the demo's working set is five replicas' caches.
	for name, fill := range map[string]float64{PresetDemo: 1.25, PresetLLMD73: 0.73} {
		o, err := Preset(name)
		require.NoError(t, err)
		o = o.WithDefaults()
		require.NoError(t, o.Validate())
		w, err := rig.BuildWorkload(o.Options)
		require.NoError(t, err)
		require.NotEmpty(t, w.Requests)
		sp := o.Workload.SharedPrefix
		distinct := sp.NumGroups*sp.SystemPromptLen + sp.NumGroups*sp.PromptsPerGroup*sp.QuestionLen
		capacity := o.Fleet.Replicas * o.Fleet.NumGPUBlocks * o.Fleet.BlockSize
		require.InDelta(t, fill, float64(distinct)/float64(capacity), 0.01, name)
	}
	o := LLMD73Options(0.1)
	require.Equal(t, []float64{15, 3, 10, 15, 20, 22, 25, 30, 35, 40, 43, 46, 49, 52, 55, 57, 60}, o.Workload.SharedPrefix.QPS)
	require.Equal(t, 1, o.Workload.SharedPrefix.WarmupStages)
	require.Equal(t, 400, o.MaxInFlight)
	require.Equal(t, 3072, o.Fleet.NumGPUBlocks*o.Fleet.BlockSize/10, "307,328 tokens per pod, scaled")
	require.Equal(t, 600, o.Workload.SharedPrefix.SystemPromptLen)
	require.Equal(t, 120, o.Workload.SharedPrefix.QuestionLen)
	require.Equal(t, 100, o.Workload.SharedPrefix.OutputLen)
	require.Equal(t, 630*time.Microsecond, *o.Fleet.Timing.PrefillPerToken)
	_, err := Preset("nope")
	require.Error(t, err)
}

func TestValidateOptions(t *testing.T) {
	tests := []struct {
		name    string
		mod     func(o *Options)
		wantErr string
	}{
		{"defaults", func(o *Options) {}, ""},
		{"labels", func(o *Options) { o.Labels = []string{"a"} }, "labels"},
		{"epps", func(o *Options) { o.EPPs = maxEPPs + 1 }, "epps"},
		{"addr on a simulated fleet", func(o *Options) { o.Policies = []string{"addr:127.0.0.1:9002"} }, "simulated fleet"},
		{"two names alike", func(o *Options) { o.Policies = []string{"precise", "precise"} }, "two policies"},
		{"rig options", func(o *Options) { o.Fleet.Mode = "cloud" }, "fleet mode"},
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

// TestAgentsPreset: at its busiest the agents scenario's active sessions'
// histories are at least 1.5x the fleet's KV cache, the load the
// acceptance asks for (calls taken as 1 s of model time), whether its
// closed-loop agents run them (the default) or they arrive open-loop;
// 32 agents and 64 sessions with -num-gpu-blocks 10400 bring them to at
// most 0.5x, and the oversubscription sweep's points (32 agents, 64
// sessions) and the workers sweep's (bench/README.md, Scenarios: agents)
// are what they are named.
func TestAgentsPreset(t *testing.T) {
	for _, tc := range []struct {
		name        string
		concurrency *int
		blocks      int
		sessions    int
		min, max    float64
	}{
		{"closed loop: 128 agents", nil, 0, 0, 5.71, 5.81},
		{"open loop", new(0), 0, 0, 3.45, 3.55},
		{"below saturation", new(32), 10400, 64, 0.4, 0.5},
		{"sweep 1.0x: 16 agents", new(16), 0, 64, 0.95, 1.05},
		{"sweep 1.57x: 32 agents", new(32), 0, 64, 1.5, 1.7},
		{"sweep 2.5x", new(32), 2041, 64, 2.45, 2.55},
		{"sweep 4x", new(32), 1276, 64, 3.95, 4.05},
		{"workers 3.1x: 64 agents", new(64), 0, 128, 3.07, 3.17},
		{"workers 4.6x: 96 agents", new(96), 0, 192, 4.53, 4.63},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := Preset(PresetAgents)
			require.NoError(t, err)
			if tc.concurrency != nil {
				o.Workload.Agents.Concurrency = tc.concurrency
			}
			if tc.sessions > 0 {
				o.Workload.Agents.Sessions = tc.sessions
			}
			if tc.blocks > 0 {
				o.Fleet.NumGPUBlocks = tc.blocks
			}
			o = o.WithDefaults()
			require.NoError(t, o.Validate())
			w, err := rig.BuildWorkload(o.Options)
			require.NoError(t, err)
			require.Equal(t, tc.concurrency == nil || *tc.concurrency > 0, w.Closed != nil)
			peak := w.PeakSessionTokens(time.Duration(float64(time.Second)/o.Fleet.TimeScale), 30)
			fleet := int64(o.Fleet.Replicas * o.Fleet.NumGPUBlocks * o.Fleet.BlockSize)
			ratio := float64(peak) / float64(fleet)
			t.Logf("peak active histories %d tokens, fleet KV %d: %.2fx", peak, fleet, ratio)
			require.GreaterOrEqual(t, ratio, tc.min)
			require.LessOrEqual(t, ratio, tc.max)
			require.Equal(t, []string{"precise", "approximate", "agent"}, o.Policies)
		})
	}
}
