package discovery

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzStaticFile checks that the endpoint file parser never panics and that
// whatever it accepts is a valid, sorted, duplicate-free set.
func FuzzStaticFile(f *testing.F) {
	f.Add([]byte("defaults: {model: m, kv_events_port: 5557}\nendpoints:\n  - {ip: 127.0.0.1, port: 8000}\n"))
	f.Add([]byte("endpoints:\n  - {ip: \"::1\", port: 8000, model: m, engine: sglang, replay_port: 5558, metrics_port: 0}\n"))
	f.Add([]byte("endpoints: []\n"))
	f.Add([]byte("endpoints:\n  - {ip: 127.0.0.1, port: 8000, model: m}\n  - {ip: 127.0.0.1, port: 8000, model: m}\n"))
	f.Add([]byte("defaults: {labels: {a: b}, metrics_path: /x}\nendpoints: [{ip: 127.0.0.1, port: 1, model: m, labels: {c: 1}}]\n"))
	f.Add([]byte("endpoints: &a [*a]\n"))
	f.Add([]byte("---\n---\n"))
	f.Add([]byte("endpoints:\n  - ip: 127.0.0.1\n    port: 0x1F40\n    model: !!binary bQ==\n"))
	if data, err := os.ReadFile(filepath.Join("..", "deploy", "config", "endpoints.example.yaml")); err == nil {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		eps, err := ParseFile(data)
		if err != nil {
			require.Nil(t, eps)
			require.NotEmpty(t, err.Error())
			return
		}
		seen := make(map[string]bool, len(eps))
		for i, ep := range eps {
			if i > 0 {
				require.Less(t, eps[i-1].Addr, ep.Addr)
			}
			require.False(t, seen[ep.Addr])
			seen[ep.Addr] = true
			_, _, err := net.SplitHostPort(ep.Addr)
			require.NoError(t, err)
			require.True(t, validEngine(ep.Engine))
			require.NotEmpty(t, ep.Model)
			for _, z := range []string{ep.KVEvents, ep.KVReplay} {
				require.True(t, z == "" || strings.HasPrefix(z, "tcp://"), z)
			}
		}
	})
}
