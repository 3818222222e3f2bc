package discovery

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnious/provider-node/endpoint"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func TestParseFile(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []endpoint.Endpoint
		wantErr string
	}{
		{
			name: "short file with defaults",
			in: `
defaults: {model: m1, kv_events_port: 5557}
endpoints:
  - {ip: 127.0.0.2, port: 8000}
  - {ip: 127.0.0.1, port: 8000}
`,
			want: []endpoint.Endpoint{
				{Addr: "127.0.0.1:8000", Model: "m1", Engine: "vllm", MetricsURL: "http://127.0.0.1:8000/metrics", KVEvents: "tcp://127.0.0.1:5557"},
				{Addr: "127.0.0.2:8000", Model: "m1", Engine: "vllm", MetricsURL: "http://127.0.0.2:8000/metrics", KVEvents: "tcp://127.0.0.2:5557"},
			},
		},
		{
			name: "entry overrides every default",
			in: `
defaults:
  model: m1
  engine: vllm
  kv_events_port: 5557
  replay_port: 5558
  metrics_port: 9000
  metrics_path: /m
  labels: {zone: a, tier: gold}
endpoints:
  - ip: 127.0.0.1
    port: 30000
    model: m2
    engine: sglang
    kv_events_port: 0
    replay_port: 6000
    metrics_port: 30001
    metrics_path: /metrics
    labels: {zone: b}
`,
			want: []endpoint.Endpoint{{
				Addr: "127.0.0.1:30000", Model: "m2", Engine: "sglang",
				MetricsURL: "http://127.0.0.1:30001/metrics", KVReplay: "tcp://127.0.0.1:6000",
				Labels: map[string]string{"zone": "b", "tier": "gold"},
			}},
		},
		{
			name: "engines that publish by connecting",
			in: `
defaults: {model: m, kv_events_port: 5557, replay_port: 5558, metrics_port: 0}
endpoints:
  - {ip: 10.0.0.1, port: 8000, kv_events_connect: true}
  - {ip: 10.0.0.2, port: 8000}
`,
			want: []endpoint.Endpoint{
				{Addr: "10.0.0.1:8000", Model: "m", Engine: "vllm", KVConnect: true},
				{Addr: "10.0.0.2:8000", Model: "m", Engine: "vllm", KVEvents: "tcp://10.0.0.2:5557", KVReplay: "tcp://10.0.0.2:5558"},
			},
		},
		{
			name: "connecting by default, one engine binds",
			in: `
defaults: {model: m, kv_events_connect: true, metrics_port: 0}
endpoints:
  - {ip: 10.0.0.1, port: 8000}
  - {ip: 10.0.0.2, port: 8000, kv_events_port: 5557, replay_port: 5558}
  - {ip: 10.0.0.3, port: 8000, kv_events_connect: false}
`,
			want: []endpoint.Endpoint{
				{Addr: "10.0.0.1:8000", Model: "m", Engine: "vllm", KVConnect: true},
				{Addr: "10.0.0.2:8000", Model: "m", Engine: "vllm", KVEvents: "tcp://10.0.0.2:5557", KVReplay: "tcp://10.0.0.2:5558"},
				{Addr: "10.0.0.3:8000", Model: "m", Engine: "vllm"},
			},
		},
		{
			name:    "connecting and a port on one entry",
			in:      "endpoints:\n  - {ip: 10.0.0.1, port: 8000, model: m, kv_events_connect: true, kv_events_port: 5557}\n",
			wantErr: "kv_events_connect and kv_events_port exclude each other",
		},
		{
			name:    "connecting in the defaults with a replay port",
			in:      "defaults: {kv_events_connect: true, replay_port: 5558}\nendpoints: []\n",
			wantErr: "defaults: kv_events_connect and replay_port exclude each other",
		},
		{
			name:    "connecting by default, a replay port on the entry",
			in:      "defaults: {kv_events_connect: true}\nendpoints:\n  - {ip: 10.0.0.1, port: 8000, model: m, replay_port: 5558}\n",
			wantErr: "replay_port with kv_events_connect",
		},
		{
			name: "data-parallel ranks on one ip, metrics off",
			in: `
endpoints:
  - {ip: 127.0.0.1, port: 8000, model: m, kv_events_port: 5557, metrics_port: 0}
  - {ip: 127.0.0.1, port: 8001, model: m, kv_events_port: 5558, metrics_port: 0}
`,
			want: []endpoint.Endpoint{
				{Addr: "127.0.0.1:8000", Model: "m", Engine: "vllm", KVEvents: "tcp://127.0.0.1:5557"},
				{Addr: "127.0.0.1:8001", Model: "m", Engine: "vllm", KVEvents: "tcp://127.0.0.1:5558"},
			},
		},
		{
			name: "ipv6 and v4-mapped",
			in: `
defaults: {model: m}
endpoints:
  - {ip: "::1", port: 8000, kv_events_port: 5557}
  - {ip: "::ffff:127.0.0.1", port: 8000}
`,
			want: []endpoint.Endpoint{
				{Addr: "127.0.0.1:8000", Model: "m", Engine: "vllm", MetricsURL: "http://127.0.0.1:8000/metrics"},
				{Addr: "[::1]:8000", Model: "m", Engine: "vllm", MetricsURL: "http://[::1]:8000/metrics", KVEvents: "tcp://[::1]:5557"},
			},
		},
		{name: "explicit empty list", in: "endpoints: []\n", want: []endpoint.Endpoint{}},
		{name: "empty file", in: "", wantErr: "endpoint file is empty"},
		{name: "no endpoints key", in: "defaults: {model: m}\n", wantErr: `no "endpoints" list`},
		{name: "unknown field", in: "endpoints:\n  - {ip: 127.0.0.1, port: 8000, model: m, prot: 1}\n", wantErr: "field prot not found"},
		{name: "unknown top-level field", in: "endpoint: []\n", wantErr: "field endpoint not found"},
		{name: "two documents", in: "endpoints: []\n---\nendpoints: []\n", wantErr: "more than one YAML document"},
		{name: "not yaml", in: "endpoints: [\n", wantErr: "cannot parse endpoint file"},
		{name: "wrong type", in: "endpoints: {ip: 1}\n", wantErr: "cannot parse endpoint file"},
		{
			name:    "bad ip",
			in:      "defaults: {model: m}\nendpoints:\n  - {ip: 127.0.0.1, port: 8000}\n  - {ip: 10.0.0.300, port: 8000}\n",
			wantErr: `endpoints[1] (line 4): bad ip "10.0.0.300"`,
		},
		{name: "host name", in: "endpoints:\n  - {ip: localhost, port: 8000, model: m}\n", wantErr: `endpoints[0] (line 2): bad ip "localhost"`},
		{name: "missing ip", in: "endpoints:\n  - {port: 8000, model: m}\n", wantErr: "endpoints[0] (line 2): missing ip"},
		{name: "unspecified ip", in: "endpoints:\n  - {ip: 0.0.0.0, port: 8000, model: m}\n", wantErr: "not a unicast address"},
		{name: "port zero", in: "endpoints:\n  - {ip: 127.0.0.1, model: m}\n", wantErr: "port 0 out of range"},
		{name: "port too big", in: "endpoints:\n  - {ip: 127.0.0.1, port: 65536, model: m}\n", wantErr: "port 65536 out of range"},
		{name: "kv port negative", in: "endpoints:\n  - {ip: 127.0.0.1, port: 8000, model: m, kv_events_port: -1}\n", wantErr: "127.0.0.1:8000: kv_events_port -1 out of range"},
		{name: "default port bad", in: "defaults: {replay_port: 70000}\nendpoints: []\n", wantErr: "defaults: replay_port 70000 out of range"},
		{
			name:    "unknown engine",
			in:      "endpoints:\n  - {ip: 127.0.0.1, port: 8000, model: m, engine: trtllm}\n",
			wantErr: `endpoints[0] (line 2): 127.0.0.1:8000: unknown engine "trtllm"`,
		},
		{name: "unknown default engine", in: "defaults: {engine: tgi}\nendpoints: []\n", wantErr: `defaults: unknown engine "tgi"`},
		{
			name:    "duplicate address",
			in:      "defaults: {model: m}\nendpoints:\n  - {ip: 127.0.0.1, port: 8000}\n  - {ip: 127.0.0.1, port: 8000}\n",
			wantErr: "endpoints[1] (line 4): duplicate address 127.0.0.1:8000 (also endpoints[0])",
		},
		{
			name:    "shared kv events port on one host",
			in:      "defaults: {model: m, kv_events_port: 5557}\nendpoints:\n  - {ip: 127.0.0.1, port: 8000}\n  - {ip: 127.0.0.1, port: 8001}\n",
			wantErr: "ZMQ endpoint tcp://127.0.0.1:5557 already used by endpoints[0]",
		},
		{name: "missing model", in: "endpoints:\n  - {ip: 127.0.0.1, port: 8000}\n", wantErr: "endpoints[0] (line 2): 127.0.0.1:8000: missing model"},
		{name: "relative metrics path", in: "endpoints:\n  - {ip: 127.0.0.1, port: 8000, model: m, metrics_path: metrics}\n", wantErr: `metrics_path "metrics" must start with /`},
		{name: "empty label key", in: "endpoints:\n  - {ip: 127.0.0.1, port: 8000, model: m, labels: {\"\": x}}\n", wantErr: "empty label key"},
		{name: "too large", in: "endpoints: []\n#" + strings.Repeat("x", MaxFileSize), wantErr: "over the"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseFile([]byte(tt.in))
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				require.Nil(t, got)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestExampleFileParses(t *testing.T) {
	eps, err := LoadFile(filepath.Join("..", "deploy", "config", "endpoints.example.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, eps)
	for _, ep := range eps {
		require.True(t, validEngine(ep.Engine), ep.Addr)
		require.NotEmpty(t, ep.Model, ep.Addr)
	}
}

func TestLoadFileMissing(t *testing.T) {
	_, err := LoadFile(filepath.Join(t.TempDir(), "nope.yaml"))
	require.ErrorContains(t, err, "cannot open endpoint file")
}

// updates collects what a Source hands to its callback.
type updates struct {
	mu  sync.Mutex
	got [][]endpoint.Endpoint
	at  []time.Time // when each update arrived
	ch  chan struct{}
}

func newUpdates() *updates { return &updates{ch: make(chan struct{}, 1)} }

// runFile runs a File source polling every 10 ms until the test ends (it
// must then return nil) and returns its updates and logs.
func runFile(t *testing.T, cfg FileConfig) (*updates, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	cfg.PollInterval = 10 * time.Millisecond
	src, err := NewFile(cfg, zap.New(core))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	u := newUpdates()
	go func() { done <- src.Run(ctx, u.update) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return u, logs
}

func (u *updates) update(eps []endpoint.Endpoint) {
	u.mu.Lock()
	u.got = append(u.got, eps)
	u.at = append(u.at, time.Now())
	u.mu.Unlock()
	select {
	case u.ch <- struct{}{}:
	default: // a wake-up is already pending; waitFor reads the latest
	}
}

func (u *updates) all() [][]endpoint.Endpoint {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([][]endpoint.Endpoint(nil), u.got...)
}

// waitFor waits until the latest update satisfies ok, and returns it.
func (u *updates) waitFor(t testing.TB, what string, ok func([]endpoint.Endpoint) bool) []endpoint.Endpoint {
	t.Helper()
	return u.waitWithin(t, 10*time.Second, what, ok)
}

func (u *updates) waitWithin(t testing.TB, timeout time.Duration, what string, ok func([]endpoint.Endpoint) bool) []endpoint.Endpoint {
	t.Helper()
	deadline := time.After(timeout)
	for {
		if all := u.all(); len(all) > 0 && ok(all[len(all)-1]) {
			return all[len(all)-1]
		}
		select {
		case <-u.ch:
		case <-deadline:
			all := u.all()
			var last []endpoint.Endpoint
			if len(all) > 0 {
				last = all[len(all)-1]
			}
			require.FailNow(t, "timed out waiting for "+what, "updates=%d last=%+v", len(all), last)
		}
	}
}

func addrs(eps []endpoint.Endpoint) []string {
	out := make([]string, len(eps))
	for i, ep := range eps {
		out[i] = ep.Addr
	}
	return out
}

// requireDistinct checks that no two consecutive updates carry the same set:
// sources only call update on a change.
func requireDistinct(t testing.TB, all [][]endpoint.Endpoint) {
	t.Helper()
	for i := 1; i < len(all); i++ {
		require.False(t, equalEndpoints(all[i-1], all[i]), "update %d repeats update %d: %v", i, i-1, addrs(all[i]))
	}
}

// writeAtomic replaces the file the way operators are told to (rename).
func writeAtomic(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(content), 0o644))
	require.NoError(t, os.Rename(tmp, path))
}

func TestFileReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	writeAtomic(t, path, "defaults: {model: m}\nendpoints:\n  - {ip: 127.0.0.1, port: 8000}\n")

	u, logs := runFile(t, FileConfig{Path: path})

	u.waitFor(t, "initial set", func(eps []endpoint.Endpoint) bool {
		return len(eps) == 1 && eps[0].Addr == "127.0.0.1:8000"
	})

	// A rewrite adds an endpoint.
	writeAtomic(t, path, "defaults: {model: m}\nendpoints:\n  - {ip: 127.0.0.1, port: 8000}\n  - {ip: 127.0.0.1, port: 8001}\n")
	u.waitFor(t, "two endpoints", func(eps []endpoint.Endpoint) bool {
		return len(eps) == 2 && eps[1].Addr == "127.0.0.1:8001"
	})

	// A bad edit keeps the last good set and is logged once however long
	// it stays.
	writeAtomic(t, path, "defaults: {model: m}\nendpoints:\n  - {ip: 127.0.0.1, port: 99999}\n")
	require.Eventually(t, func() bool {
		return logs.FilterMessage("endpoint file invalid, keeping the last good set").Len() == 1
	}, 10*time.Second, 5*time.Millisecond)
	time.Sleep(100 * time.Millisecond) // ten more polls of the same bad content
	require.Equal(t, 1, logs.FilterMessage("endpoint file invalid, keeping the last good set").Len())
	require.Len(t, u.all(), 2)

	// A deleted file is also logged once and keeps the set.
	require.NoError(t, os.Remove(path))
	require.Eventually(t, func() bool {
		return logs.FilterMessage("endpoint file unreadable, keeping the last good set").Len() == 1
	}, 10*time.Second, 5*time.Millisecond)

	// An edit that parses to the same set sends nothing; a real change does.
	writeAtomic(t, path, "# same set, reformatted\ndefaults: {model: m}\nendpoints: [{ip: 127.0.0.1, port: 8000}, {ip: 127.0.0.1, port: 8001}]\n")
	time.Sleep(100 * time.Millisecond)
	require.Len(t, u.all(), 2)
	writeAtomic(t, path, "endpoints:\n  - {ip: 127.0.0.1, port: 8001, model: m2, engine: sglang}\n")
	got := u.waitFor(t, "sglang endpoint", func(eps []endpoint.Endpoint) bool {
		return len(eps) == 1 && eps[0].Engine == "sglang"
	})
	require.Equal(t, "m2", got[0].Model)
	requireDistinct(t, u.all())
}

func TestFileRunBadInitial(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	require.NoError(t, os.WriteFile(path, []byte("endpoints:\n  - {ip: 127.0.0.1, port: 8000}\n"), 0o644))
	src, err := NewFile(FileConfig{Path: path}, nil)
	require.NoError(t, err)
	called := false
	err = src.Run(context.Background(), func([]endpoint.Endpoint) { called = true })
	require.ErrorContains(t, err, "missing model")
	require.False(t, called)

	_, err = NewFile(FileConfig{}, nil)
	require.Error(t, err)
}
