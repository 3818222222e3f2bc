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
