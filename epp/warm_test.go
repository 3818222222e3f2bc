package epp

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/omnious/provider-node/discovery"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/kvevents"
	"github.com/omnious/provider-node/engines/sim"
	"github.com/omnious/provider-node/engines/sim/simtest"
	"github.com/omnious/provider-node/kvindex"
)

const testModel = "Qwen/Qwen3-32B"

// testConfig is a config on loopback with free ports.
func testConfig(t *testing.T, extra string) Config {
	t.Helper()
	cfg, err := Parse([]byte("grpc_addr: 127.0.0.1:0\nhealth_addr: 127.0.0.1:0\nmetrics_addr: 127.0.0.1:0\nadmin_addr: 127.0.0.1:0\nstandin_tokenizer: true\n" + extra))
	require.NoError(t, err)
	return cfg
}

// run starts e until the test ends.
func run(t *testing.T, e *EPP) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(40 * time.Second):
			t.Error("EPP did not stop")
		}
	})
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, url)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
}

// resident returns the EPP's resident blocks per endpoint, from its admin view.
func resident(t *testing.T, admin string) map[string]int {
	var eps []struct {
		Addr     string
		Resident int `json:"resident_blocks"`
	}
	getJSON(t, "http://"+admin+"/debug/endpoints", &eps)
	out := map[string]int{}
	for _, e := range eps {
		out[e.Addr] = e.Resident
	}
	return out
}

// TestConnectingPublisherFeedsTheIndex: with ingest.bind, an engine that
// publishes by connecting (as llm-d's centralized mode and its simulator
// do) reaches the index through the EPP's assembly, by its topic; a topic
// of no endpoint is counted and creates nothing.
func TestConnectingPublisherFeedsTheIndex(t *testing.T) {
	cfg := testConfig(t, "ingest:\n  bind: tcp://127.0.0.1:0\n")
	eps := []endpoint.Endpoint{
		{Addr: "10.1.0.1:8000", Model: testModel, Engine: "vllm", KVConnect: true},
		{Addr: "127.0.0.1:8000", Model: testModel, Engine: "vllm", KVConnect: true},
	}
	e, err := New(cfg, discovery.Fixed(eps), zap.NewNop())
	require.NoError(t, err)
	run(t, e)
	bound := e.ingest.BoundEndpoint()
	require.True(t, strings.HasPrefix(bound, "tcp://127.0.0.1:"), bound)

	// The EPP accepts a connection only from an address one of its
	// endpoints has, and learns its endpoints from discovery after it
	// starts; a dialing publisher redials until it is let in, as libzmq
	// does (kvevents' TestPublisherDialsBeforeSubscriberListens).
	pub := func(topic string) *kvevents.Publisher {
		p, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: bound, Dial: true, Topic: topic, Format: kvevents.FormatMap}, zap.NewNop())
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Close() })
		return p
	}
	known, stranger := pub("kv@127.0.0.1:8000@"+testModel), pub("kv@10.1.0.9:8000@"+testModel)
	toks := make([]uint32, 48)
	for i := range toks {
		toks[i] = uint32(i + 1)
	}
	// ZMQ drops what is sent before the connection is up: publish until
	// the blocks show.
	require.Eventually(t, func() bool {
		_, err := known.Publish([]kvevents.Event{{Kind: kvevents.KindBlockStored, BlockHashes: []uint64{11, 12, 13}, TokenIDs: toks, BlockSize: 16, Medium: "GPU"}})
		require.NoError(t, err)
		_, err = stranger.Publish([]kvevents.Event{{Kind: kvevents.KindBlockStored, BlockHashes: []uint64{21}, TokenIDs: toks[:16], BlockSize: 16}})
		require.NoError(t, err)
		r := resident(t, e.AdminAddr())
		return r["127.0.0.1:8000"] == 3 && metricSum(t, e.MetricsAddr(), `omnious_epp_kv_events_total{outcome="unknown_topic",replica="bound"}`) > 0
	}, 10*time.Second, 20*time.Millisecond)
	require.Zero(t, resident(t, e.AdminAddr())["10.1.0.1:8000"])
	id, ok := e.ids.Lookup("127.0.0.1:8000")
	require.True(t, ok)
	keys := kvindex.AppendBlockKeys(nil, kvindex.RootKey(testModel, "", ""), toks, 16)
	require.Equal(t, []kvindex.Match{{Replica: id, Blocks: 3, ByTier: [kvindex.NumTiers]int{3, 0, 0}}}, clean(e.ix.Match(keys, nil)))
	require.Equal(t, 3, e.ix.Stats().Residencies, "the unknown topic created nothing")
}

// clean drops Match's unexported bookkeeping for comparison.
func clean(ms []kvindex.Match) []kvindex.Match {
	out := make([]kvindex.Match, len(ms))
	for i, m := range ms {
		out[i] = kvindex.Match{Replica: m.Replica, Blocks: m.Blocks, ByTier: m.ByTier}
	}
	return out
}

// metricSum sums the series of an exposition whose line starts with prefix.
func metricSum(t *testing.T, addr, prefix string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, err = buf.ReadFrom(resp.Body)
	require.NoError(t, err)
	sum := 0.0
	for line := range strings.Lines(buf.String()) {
		if strings.HasPrefix(line, prefix) {
			var v float64
			_, err := fmt.Sscan(strings.TrimSpace(line[strings.LastIndexByte(line, ' '):]), &v)
			require.NoError(t, err)
			sum += v
		}
	}
	return sum
}

// startSims runs n simulated engines in process with replay, and returns
// them as the EPP discovers them.
func startSims(t *testing.T, n int) ([]endpoint.Endpoint, []string) {
	var eps []endpoint.Endpoint
	var bases []string
	for i := 0; i < n; i++ {
		r := simtest.Start(t, func(c *sim.Config) {
			c.Seed = int64(i)
			c.KVEvents.ReplayEndpoint = "tcp://127.0.0.1:0"
			c.Engine.NumGPUBlocks = 512
		})
		pub, replay := r.KVEndpoints()
		eps = append(eps, endpoint.Endpoint{Addr: r.Addr(), Model: testModel, Engine: "vllm", KVEvents: pub, KVReplay: replay})
		bases = append(bases, "http://"+r.Addr())
	}
	return eps, bases
}

func complete(t *testing.T, base string, prompt []uint32) {
	raw, err := json.Marshal(map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 2, "ignore_eos": true})
	require.NoError(t, err)
	resp, err := http.Post(base+"/v1/completions", "application/json", bytes.NewReader(raw))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// gpuBlocks is how many GPU blocks a simulator holds.
func gpuBlocks(t *testing.T, base string) int {
	var view struct {
		Blocks []struct{ Medium string } `json:"blocks"`
	}
	getJSON(t, base+"/admin/blocks", &view)
	n := 0
	for _, b := range view.Blocks {
		if b.Medium == "GPU" {
			n++
		}
	}
	return n
}

// TestWarmStartFromSibling: EPP B, started with EPP A as its peer, serves
// A's index at once: every replica resumed from A's snapshot, nothing
// replayed from the start of the engines' buffers, and new events followed.
func TestWarmStartFromSibling(t *testing.T) {
	eps, bases := startSims(t, 2)
	for i, base := range bases {
		for j := 0; j < 6; j++ {
			p := make([]uint32, 64+16*j)
			for k := range p {
				p[k] = uint32(1000*i + 100*j + k)
			}
			complete(t, base, p)
		}
	}
	a, err := New(testConfig(t, ""), discovery.Fixed(eps), zap.NewNop())
	require.NoError(t, err)
	run(t, a)
	agree := func(admin string) bool {
		r := resident(t, admin)
		for i, ep := range eps {
			if r[ep.Addr] == 0 || r[ep.Addr] != gpuBlocks(t, bases[i]) {
				return false
			}
		}
		return true
	}
	require.Eventually(t, func() bool { return agree(a.AdminAddr()) }, 10*time.Second, 10*time.Millisecond, "A follows the engines")

	core, logs := observer.New(zapcore.InfoLevel)
	b, err := New(testConfig(t, fmt.Sprintf("warm_start:\n  peers: [%q]\n", a.AdminAddr())), discovery.Fixed(eps), zap.New(core))
	require.NoError(t, err)
	require.Equal(t, 1, logs.FilterMessage("warm start: index loaded from a sibling").Len(), "%v", logs.All())
	run(t, b)
	require.Eventually(t, func() bool { return agree(b.AdminAddr()) }, 5*time.Second, 5*time.Millisecond, "B agrees with the engines")
	require.Eventually(t, func() bool {
		return metricSum(t, b.MetricsAddr(), `omnious_epp_kv_sequence_total{event="resume"`) == 2
	}, 5*time.Second, 5*time.Millisecond)
	require.Zero(t, metricSum(t, b.MetricsAddr(), `omnious_epp_kv_sequence_total{event="resume_failure"`))
	require.Zero(t, metricSum(t, b.MetricsAddr(), `omnious_epp_kv_sequence_total{event="start_replay"`), "resumed, not replayed from the buffers' start")

	// B follows what the engines store next.
	complete(t, bases[0], []uint32{9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7})
	require.Eventually(t, func() bool { return agree(b.AdminAddr()) && agree(a.AdminAddr()) }, 5*time.Second, 5*time.Millisecond)
}

// TestWarmStartRefused: a sibling's answer that is not a whole snapshot of
// this EPP's kind is refused with a log line saying why, and the EPP starts
// cold from an empty index.
func TestWarmStartRefused(t *testing.T) {
	snapshot := func(h kvindex.SnapshotHeader) []byte {
		ix := kvindex.New(kvindex.Config{})
		s := kvindex.NewReplicaState(ix, 0, testModel)
		toks := make([]uint32, 32)
		s.ApplyBatch(&kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.KindBlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: toks, BlockSize: 16}}})
		var buf bytes.Buffer
		sw := kvindex.NewSnapshotWriter(&buf, h)
		require.NoError(t, sw.AddReplica(kvindex.ReplicaTag{Name: "10.2.0.1:8000"}, s))
		require.NoError(t, sw.Close())
		return buf.Bytes()
	}
	good := snapshot(kvindex.SnapshotHeader{BlockSize: 16})
	tests := []struct {
		name   string
		status int
		body   []byte
		reason string
	}{
		{"busy sibling", http.StatusServiceUnavailable, nil, "answered 503"},
		{"not a snapshot", http.StatusOK, []byte("<html>hello</html>"), "not an index snapshot"},
		{"other block size", http.StatusOK, snapshot(kvindex.SnapshotHeader{BlockSize: 64}), "block size 64, this EPP's is 16"},
		{"other pool", http.StatusOK, snapshot(kvindex.SnapshotHeader{BlockSize: 16, Pool: "llm/other"}), `pool "llm/other"`},
		{"truncated", http.StatusOK, good[:len(good)-3], "truncated index snapshot"},
		{"corrupt", http.StatusOK, append(append([]byte(nil), good[:40]...), append([]byte{good[40] ^ 1}, good[41:]...)...), "corrupt index snapshot"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				require.Equal(t, kvindex.SnapshotPath, r.URL.Path)
				w.WriteHeader(tt.status)
				_, _ = w.Write(tt.body)
			}))
			defer srv.Close()
			core, logs := observer.New(zapcore.InfoLevel)
			cfg := testConfig(t, fmt.Sprintf("warm_start:\n  peers: [%q]\n", strings.TrimPrefix(srv.URL, "http://")))
			e, err := New(cfg, discovery.Fixed(nil), zap.New(core))
			require.NoError(t, err)
			defer e.closeListeners()
			defer e.ingest.Close()
			refused := logs.FilterMessage("warm start: index snapshot refused").All()
			require.Len(t, refused, 1)
			require.Contains(t, refused[0].ContextMap()["error"], tt.reason)
			require.Equal(t, 1, logs.FilterMessage("warm start: no sibling gave a usable snapshot; starting cold, from the engines' replay buffers").Len())
			require.Zero(t, e.ix.Stats().Keys, "cold: an empty index")
		})
	}
	t.Run("the good one loads", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(good) }))
		defer srv.Close()
		e, err := New(testConfig(t, fmt.Sprintf("warm_start:\n  peers: [%q]\n", strings.TrimPrefix(srv.URL, "http://"))), discovery.Fixed(nil), zap.NewNop())
		require.NoError(t, err)
		defer e.closeListeners()
		defer e.ingest.Close()
		require.Equal(t, 2, e.ix.Stats().Keys)
	})
}

// TestSiblings: the peers to ask are the configured ones and the peer
// Service's addresses, once each, without the EPP itself.
func TestSiblings(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	_, own, _ := net.SplitHostPort(ln.Addr().String())
	cfg := testConfig(t, "")
	cfg.AdminAddr = ln.Addr().String()
	cfg.WarmStart.Peers = []string{"127.0.0.1:" + own, "10.3.0.1:9091", "localhost:" + own, "10.3.0.1:9091", "10.3.0.2:9091"}
	cfg.WarmStart.PeerService = "localhost:9999"
	e := &EPP{cfg: cfg}
	got, err := e.siblings(context.Background())
	require.NoError(t, err)
	require.Subset(t, got, []string{"10.3.0.1:9091", "10.3.0.2:9091", "127.0.0.1:9999"})
	require.NotContains(t, got, "127.0.0.1:"+own)
	require.NotContains(t, got, "localhost:"+own)
	require.Len(t, got[:3], 3)
	require.Equal(t, []string{"10.3.0.1:9091", "10.3.0.2:9091"}, got[:2], "configured peers first, in order, once")

	e.cfg.WarmStart.PeerService = "localhost:" + own
	got, err = e.siblings(context.Background())
	require.NoError(t, err)
	require.Equal(t, []string{"10.3.0.1:9091", "10.3.0.2:9091"}, got, "the service's address of this EPP is skipped")

	// Where the resolver answers "no such host" (NXDOMAIN, as for a
	// headless Service without ready Pods).
	var dnsErr *net.DNSError
	if _, err := net.DefaultResolver.LookupIPAddr(context.Background(), "no-such-epp-peers.invalid"); !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
		t.Skipf("the resolver does not answer NXDOMAIN here: %v", err)
	}
	e.cfg.WarmStart.Peers, e.cfg.WarmStart.PeerService = nil, "no-such-epp-peers.invalid:9091"
	got, err = e.siblings(context.Background())
	require.NoError(t, err, "a name without addresses (no ready sibling) is no sibling, not an error")
	require.Empty(t, got)
}

// TestSnapshotServedOneAtATime: a second request while one is served is
// told to retry.
func TestSnapshotServedOneAtATime(t *testing.T) {
	e, err := New(testConfig(t, ""), discovery.Fixed(nil), zap.NewNop())
	require.NoError(t, err)
	defer e.closeListeners()
	defer e.ingest.Close()
	e.snapMu.Lock()
	rec := httptest.NewRecorder()
	e.serveSnapshot(rec, httptest.NewRequest(http.MethodGet, kvindex.SnapshotPath, nil))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	e.snapMu.Unlock()
	rec = httptest.NewRecorder()
	e.serveSnapshot(rec, httptest.NewRequest(http.MethodGet, kvindex.SnapshotPath, nil))
	require.Equal(t, http.StatusOK, rec.Code)
	snap, err := kvindex.LoadSnapshot(rec.Body, kvindex.LoadOptions{Want: kvindex.SnapshotHeader{BlockSize: 16}})
	require.NoError(t, err)
	require.Empty(t, snap.Replicas)
}

// TestSnapshotVersionAsked: a sibling gets the newest format it names, and
// version 1 when it names none (an EPP of an earlier release), so two
// releases warm-start each other during a rolling upgrade.
func TestSnapshotVersionAsked(t *testing.T) {
	e, err := New(testConfig(t, ""), discovery.Fixed(nil), zap.NewNop())
	require.NoError(t, err)
	defer e.closeListeners()
	defer e.ingest.Close()
	for _, tc := range []struct {
		query string
		code  int
		want  uint16
	}{
		{"", http.StatusOK, 1},
		{"?version=1", http.StatusOK, 1},
		{fmt.Sprintf("?version=%d", kvindex.SnapshotVersion), http.StatusOK, kvindex.SnapshotVersion},
		{"?version=99", http.StatusOK, kvindex.SnapshotVersion},
		{"?version=0", http.StatusBadRequest, 0},
		{"?version=two", http.StatusBadRequest, 0},
	} {
		rec := httptest.NewRecorder()
		e.serveSnapshot(rec, httptest.NewRequest(http.MethodGet, kvindex.SnapshotPath+tc.query, nil))
		require.Equal(t, tc.code, rec.Code, tc.query)
		if tc.code != http.StatusOK {
			continue
		}
		b := rec.Body.Bytes()
		require.GreaterOrEqual(t, len(b), 10, tc.query)
		require.Equal(t, tc.want, binary.BigEndian.Uint16(b[8:10]), tc.query)
		_, err := kvindex.LoadSnapshot(bytes.NewReader(b), kvindex.LoadOptions{Want: kvindex.SnapshotHeader{BlockSize: 16}})
		require.NoError(t, err, tc.query)
	}
}

func TestParseWarmStart(t *testing.T) {
	c, err := Parse([]byte("warm_start:\n  peers: [a:1, \"[::1]:2\"]\n  peer_service: epp-peers.llm.svc:9091\n  timeout: 2s\n"))
	require.NoError(t, err)
	require.NoError(t, c.Validate())
	require.Equal(t, []string{"a:1", "[::1]:2"}, c.WarmStart.Peers)
	require.Equal(t, 2*time.Second, c.WarmStart.Timeout)
	require.Equal(t, int64(1<<30), c.WarmStart.MaxBytes)
	c, err = Parse([]byte("warm_start:\n  peers: [epp-b]\n  peer_service: epp\n"))
	require.NoError(t, err)
	err = c.Validate()
	require.ErrorContains(t, err, `warm_start.peers: "epp-b" is not host:port`)
	require.ErrorContains(t, err, `warm_start.peer_service: "epp" is not host:port`)
}
