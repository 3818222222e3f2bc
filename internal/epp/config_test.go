package epp

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/extproc"
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
