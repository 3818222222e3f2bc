package epp

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/extproc"
	"github.com/omnious/provider-node/internal/testutil/conftest"
	"github.com/omnious/provider-node/scheduler"
)

func TestParseExtProcIdleTimeouts(t *testing.T) {
	cases := []struct {
		name          string
		yaml          string
		wantReq       time.Duration
		wantResp      time.Duration
		wantParseFail bool
	}{
		{"defaults", "", extproc.DefaultRequestIdleTimeout, extproc.DefaultResponseIdleTimeout, false},
		{"set", "extproc:\n  request_idle_timeout: 5s\n  response_idle_timeout: 20m\n", 5 * time.Second, 20 * time.Minute, false},
		{"disabled", "extproc:\n  request_idle_timeout: -1s\n", -time.Second, extproc.DefaultResponseIdleTimeout, false},
		{"not a duration", "extproc:\n  request_idle_timeout: soon\n", 0, 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.yaml))
			if tc.wantParseFail {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.wantReq, c.ExtProc.RequestIdleTimeout)
			require.Equal(t, tc.wantResp, c.ExtProc.ResponseIdleTimeout)
		})
	}
}

func TestParseTracing(t *testing.T) {
	cases := []struct {
		name      string
		yaml      string
		endpoint  string
		ratio     float64
		service   string
		wantError string
	}{
		{"off by default", "", "", DefaultTraceSampleRatio, "omnious-epp", ""},
		{"set", "tracing:\n  otlp_endpoint: otel:4317\n  insecure: true\n  sample_ratio: 0\n  service_name: epp-a\n", "otel:4317", 0, "epp-a", ""},
		{"ratio above one", "tracing:\n  sample_ratio: 1.5\n", "", 1.5, "omnious-epp", "tracing.sample_ratio 1.5 is not in [0, 1]"},
		{"unknown key", "tracing:\n  endpoint: x\n", "", 0, "", "field endpoint not found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.yaml))
			if err == nil {
				err = c.Validate()
			}
			if tc.wantError != "" {
				require.ErrorContains(t, err, tc.wantError)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.endpoint, c.Tracing.OTLPEndpoint)
			require.Equal(t, tc.ratio, *c.Tracing.SampleRatio)
			require.Equal(t, tc.service, c.Tracing.ServiceName)
			tp, err := newTracerProvider(c.Tracing)
			require.NoError(t, err)
			require.Equal(t, tc.endpoint != "", tp != nil, "a provider exactly when an endpoint is set")
			require.NoError(t, shutdownTracing(t.Context(), tp))
		})
	}
}

// TestZeroIsASetting: a key whose zero is legal keeps an explicit zero,
// in the EPP's own keys and in the sections it decodes.
func TestZeroIsASetting(t *testing.T) {
	for _, key := range []string{
		"drain_delay", "drain_timeout", "standin_tokenizer",
		"tracing.insecure", "tracing.sample_ratio",
		"extproc.max_endpoints",
		"scheduler.fallbacks", "scheduler.prefix.balance_abs", "scheduler.prefix.speculative_ttl",
		"scheduler.scoring.stale_factor", "scheduler.admission.queue_capacity_per_band",
	} {
		t.Run(key, func(t *testing.T) {
			doc := conftest.ZeroYAML(key, conftest.Lookup(t, conftest.Fields(Config{}.WithDefaults()), key))
			c, err := Parse([]byte(doc))
			require.NoError(t, err, doc)
			require.NoError(t, c.Validate())
			require.True(t, conftest.IsZero(conftest.Lookup(t, conftest.Fields(c), key)), "%s after defaults", doc)
		})
	}
}

// TestParseErrors: unknown keys are errors at every level, including the
// block size ingestion no longer has.
func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"top level", "grpc_adr: x\n", "field grpc_adr not found"},
		{"ingest.block_size is gone", "ingest:\n  block_size: 16\n", "field block_size not found"},
		{"extproc", "extproc:\n  max_endpoint: 1\n", "field max_endpoint not found"},
		{"scheduler", "scheduler:\n  polcy: random\n", "field polcy not found"},
		{"nested scheduler", "scheduler:\n  prefix:\n    min_mtach: 1\n", "field min_mtach not found"},
		{"scheduler value", "scheduler:\n  fallbacks: 17\n", "fallbacks 17: want 0..16"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml))
			require.ErrorContains(t, err, tt.want)
		})
	}
}

// TestDefaultsFillTheScheduler: WithDefaults fills the scheduler section
// with the rest, for a config built in Go as for a parsed one.
func TestDefaultsFillTheScheduler(t *testing.T) {
	c := Config{}.WithDefaults()
	require.Equal(t, scheduler.DefaultConfig(), c.Scheduler)
	require.NoError(t, c.Validate())
	p, err := Parse([]byte("scheduler:\n  block_size: 32\n"))
	require.NoError(t, err)
	want := scheduler.DefaultConfig()
	want.BlockSize = 32
	require.Equal(t, want, p.Scheduler)
}
