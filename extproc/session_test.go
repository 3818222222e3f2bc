package extproc

import (
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/stretchr/testify/require"
)

// TestSessionHeaderBound: a session key reaches the scheduler at most
// maxSessionKey bytes long, and two long keys that differ only past the
// cut stay apart.
func TestSessionHeaderBound(t *testing.T) {
	long := strings.Repeat("s", 1<<20)
	for _, tc := range []struct {
		name, v string
		same    bool // the key passes unchanged
	}{
		{"empty", "", true},
		{"short", "agent-42", true},
		{"at the bound", strings.Repeat("a", maxSessionKey), true},
		{"over the bound", strings.Repeat("a", maxSessionKey+1), false},
		{"1 MiB", long, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := sessionHeader(&corev3.HeaderValue{RawValue: []byte(tc.v)})
			require.LessOrEqual(t, len(got), maxSessionKey)
			if tc.same {
				require.Equal(t, tc.v, got)
				return
			}
			require.Len(t, got, maxSessionKey)
			require.Equal(t, tc.v[:maxSessionKey-17], got[:maxSessionKey-17])
		})
	}
	a := sessionHeader(&corev3.HeaderValue{RawValue: []byte(long + "a")})
	b := sessionHeader(&corev3.HeaderValue{RawValue: []byte(long + "b")})
	require.NotEqual(t, a, b)
}
