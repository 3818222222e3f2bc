package ingest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/omnious/provider-node/engines/kvevents"
	"github.com/omnious/provider-node/engines/sim"
	"github.com/omnious/provider-node/engines/sim/engine"
	"github.com/omnious/provider-node/engines/sim/simtest"
	"github.com/omnious/provider-node/kvindex"
)

const model = "Qwen/Qwen3-32B"

type replica struct {
	addr   string // HTTP ip:port
	base   string
	pub    string
	replay string
}

// startSim runs one simulated engine rank on loopback until the test ends,
// with replay and a small cache (evictions happen).
func startSim(t *testing.T, mutate func(*sim.Config)) *replica {
	t.Helper()
	r := simtest.Start(t, func(c *sim.Config) {
		c.Seed = 11
		c.KVEvents.ReplayEndpoint = "tcp://127.0.0.1:0"
		c.Engine.TimeScale = 200
		c.Engine.NumGPUBlocks = 64
		mutate(c)
	})
	rep := &replica{addr: r.Addr(), base: "http://" + r.Addr()}
	rep.pub, rep.replay = r.KVEndpoints()
	return rep
}

// startProcess runs the enginesim binary as one replica (with replay and a
// small cache) until the test ends; args add flags.
func startProcess(t *testing.T, bin string, args ...string) *replica {
	t.Helper()
	port := func() int { return simtest.FreePort(t) }
	rep := &replica{addr: fmt.Sprintf("127.0.0.1:%d", port()),
		pub: fmt.Sprintf("tcp://127.0.0.1:%d", port()), replay: fmt.Sprintf("tcp://127.0.0.1:%d", port())}
	rep.base = "http://" + rep.addr
	cmd := exec.Command(bin, append([]string{"-listen", rep.addr, "-kv-events-endpoint", rep.pub,
		"-kv-events-replay-endpoint", rep.replay, "-num-gpu-blocks", "64", "-time-scale", "200", "-seed", "11",
		"-log-level", "warn"}, args...)...)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	simtest.WaitOK(t, rep.base+"/health")
	return rep
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
}

func postJSON(t *testing.T, url string, body any) {
	t.Helper()
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	resp, err := http.Post(url, "application/json", bytes.NewReader(raw))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, url)
}

func (r *replica) complete(t *testing.T, prompt []uint32) {
	postJSON(t, r.base+"/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 3, "ignore_eos": true})
}

// truth is what the simulator holds: resident GPU blocks by (parent, tokens).
type truth struct {
	gpu   int
	chain map[string]uint64
}

func chainKey(parent uint64, hasParent bool, tokens []uint32) string {
	return fmt.Sprint(parent, hasParent, tokens)
}

func (r *replica) truth(t *testing.T) truth {
	var view struct {
		Blocks []engine.ResidentBlock `json:"blocks"`
	}
	getJSON(t, r.base+"/admin/blocks", &view)
	tr := truth{chain: map[string]uint64{}}
	for _, b := range view.Blocks {
		if b.Medium != engine.MediumGPU {
			continue
		}
		tr.gpu++
		tr.chain[chainKey(b.ParentHash, b.HasParent, b.TokenIDs)] = b.Hash
	}
	return tr
}

// prefix is how many leading blocks of prompt the simulator really holds.
func (tr truth) prefix(prompt []uint32, bs int) int {
	var parent uint64
	n := 0
	for i := 0; (i+1)*bs <= len(prompt); i++ {
		h, ok := tr.chain[chainKey(parent, i > 0, prompt[i*bs:(i+1)*bs])]
		if !ok {
			break
		}
		parent, n = h, n+1
	}
	return n
}

// indexPrefix is how many leading blocks the index says replica id holds.
func indexPrefix(ix *kvindex.Index, id kvindex.Replica, prompt []uint32) int {
	keys := kvindex.AppendBlockKeys(nil, kvindex.RootKey(model, "", ""), prompt, 16)
	matches := ix.Match(keys, nil)
	for _, m := range matches {
		if m.Replica == id {
			return m.ByTier[kvindex.TierGPU]
		}
	}
	return 0
}

// workload builds prompts that share prefixes: groups of a system part plus
// a question, as token ids (the completions API takes them as given).
func workload(rng *rand.Rand, n int) [][]uint32 {
	systems := make([][]uint32, 5)
	for i := range systems {
		systems[i] = make([]uint32, 16*(2+rng.IntN(6))+rng.IntN(16))
		for j := range systems[i] {
			systems[i][j] = uint32(1000*i + j)
		}
	}
	prompts := make([][]uint32, n)
	for i := range prompts {
		p := append([]uint32(nil), systems[rng.IntN(len(systems))]...)
		for j := 0; j < 8+rng.IntN(60); j++ {
			p = append(p, uint32(50000+rng.IntN(20000)))
		}
		prompts[i] = p
	}
	return prompts
}

// TestIndexAgreesWithSimulators drives three enginesim processes of
// different flavours and wire encodings, with evictions, a forced gap filled by replay
// and a restart, and checks that the index answers every prompt's prefix
// question exactly as the engines' own caches do.
func TestIndexAgreesWithSimulators(t *testing.T) {
	bin := simtest.Binary(t)
	sims := []*replica{
		startProcess(t, bin, "-engine", "vllm"),
		startProcess(t, bin, "-engine", "sglang"),
		startProcess(t, bin, "-engine", "vllm", "-kv-events-format", "array", "-kv-events-hashes", "bytes"),
	}
	ix := kvindex.New(kvindex.Config{})
	m, err := New(Config{}, 16, ix, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	require.NoError(t, err)
	defer m.Close()
	reg := prometheus.NewRegistry()
	require.NoError(t, m.Register(reg))
	sources := make([]Source, len(sims))
	for i, s := range sims {
		sources[i] = Source{Replica: kvindex.Replica(i), Name: s.addr, Model: model, Endpoint: s.pub, Replay: s.replay}
	}
	m.Set(sources)

	// ZMQ drops what is published before the subscription connects: warm
	// each replica up until its events show, then restart it so the test
	// starts from a state the index saw whole.
	for i, s := range sims {
		probe := 0
		require.Eventually(t, func() bool {
			probe++
			p := make([]uint32, 40)
			for j := range p {
				p[j] = uint32(900000 + probe*100 + j)
			}
			s.complete(t, p)
			return ix.Resident(kvindex.Replica(i)) > 0
		}, 10*time.Second, 20*time.Millisecond)
		postJSON(t, s.base+"/admin/restart", map[string]any{})
	}

	rng := rand.New(rand.NewPCG(1, 2))
	prompts := workload(rng, 120)
	agree := func(stage string) {
		t.Helper()
		require.Eventually(t, func() bool {
			for i, s := range sims {
				tr := s.truth(t)
				// The simulated replicas have no CPU tier: every block is a GPU block.
				if ix.Resident(kvindex.Replica(i)) != tr.gpu {
					return false
				}
			}
			return true
		}, 10*time.Second, 20*time.Millisecond, "%s: resident block counts agree", stage)
		hits := 0
		for i, s := range sims {
			tr := s.truth(t)
			for _, p := range prompts {
				want := tr.prefix(p, 16)
				hits += want
				require.Equal(t, want, indexPrefix(ix, kvindex.Replica(i), p), "%s: replica %d prefix of a prompt", stage, i)
			}
		}
		require.Positive(t, hits, "%s: some prompts are cached", stage)
	}

	for _, p := range prompts[:60] {
		sims[rng.IntN(len(sims))].complete(t, p)
	}
	agree("after the first half")

	// A forced gap on replica 0 (filled by replay) and a restart of replica 1.
	postJSON(t, sims[0].base+"/admin/drop-events", map[string]any{"batches": 3})
	postJSON(t, sims[1].base+"/admin/restart", map[string]any{})
	for _, p := range prompts[60:] {
		sims[rng.IntN(len(sims))].complete(t, p)
	}
	agree("after a gap and a restart")

	evicted := 0.0
	for i := range sims {
		evicted += metricValue(t, reg, "omnious_epp_kv_blocks_total", "removed", sims[i].addr)
	}
	require.Positive(t, evicted, "the small caches evicted, and the index followed")
	require.Positive(t, metricValue(t, reg, "omnious_epp_kv_sequence_total", "replay", sims[0].addr))

	// A replica that leaves the pool is purged.
	m.Set(sources[1:])
	require.Zero(t, ix.Resident(0))
}

// metricValue returns the value of one series gathered from reg; labels
// are its label values in the order of the sorted label names.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var vals []string
			for _, lp := range m.GetLabel() {
				vals = append(vals, lp.GetValue())
			}
			if strings.Join(vals, ",") != strings.Join(labels, ",") {
				continue
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0
}

// TestGapWithoutReplayResets checks that when replay is unavailable the
// replica is dropped and rebuilt from new events, never guessed.
func TestGapWithoutReplayResets(t *testing.T) {
	s := startSim(t, func(c *sim.Config) { c.KVEvents.ReplayEndpoint = ""; c.Engine.NumGPUBlocks = 512 })
	ix := kvindex.New(kvindex.Config{})
	m, err := New(Config{}, 16, ix, zap.NewNop())
	require.NoError(t, err)
	defer m.Close()
	m.Set([]Source{{Replica: 0, Name: "a", Model: model, Endpoint: s.pub}})
	probe := 0
	require.Eventually(t, func() bool {
		probe++
		p := make([]uint32, 40)
		for j := range p {
			p[j] = uint32(900000 + probe*100 + j)
		}
		s.complete(t, p)
		return ix.Resident(0) > 0
	}, 10*time.Second, 20*time.Millisecond)
	before := make([]uint32, 64)
	for i := range before {
		before[i] = uint32(i + 1)
	}
	s.complete(t, before)
	require.Eventually(t, func() bool { return indexPrefix(ix, 0, before) == 4 }, 5*time.Second, 10*time.Millisecond)

	postJSON(t, s.base+"/admin/drop-events", map[string]any{"batches": 1})
	lost := make([]uint32, 48)
	for i := range lost {
		lost[i] = uint32(5000 + i)
	}
	s.complete(t, lost) // published into the gap
	after := make([]uint32, 32)
	for i := range after {
		after[i] = uint32(7000 + i)
	}
	s.complete(t, after) // reveals the gap: the replica is reset
	require.Eventually(t, func() bool { return indexPrefix(ix, 0, before) == 0 }, 5*time.Second, 10*time.Millisecond,
		"entries from before the gap are dropped, not kept as a guess")
	require.Zero(t, indexPrefix(ix, 0, lost), "the lost batch is not guessed")
	more := make([]uint32, 32)
	for i := range more {
		more[i] = uint32(9000 + i)
	}
	s.complete(t, more)
	require.Eventually(t, func() bool { return indexPrefix(ix, 0, more) == 2 }, 5*time.Second, 10*time.Millisecond,
		"rebuilt from new events")
	require.LessOrEqual(t, ix.Resident(0), s.truth(t).gpu) // GPU blocks only: no CPU tier
}

// prompt returns n tokens starting at base.
func prompt(base, n int) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = uint32(base + i)
	}
	return p
}

// agrees waits until the index holds exactly what each simulator holds, then
// checks every prompt's prefix against the simulators' own caches.
func agrees(t *testing.T, ix *kvindex.Index, sims []*replica, prompts [][]uint32, within time.Duration, stage string) {
	t.Helper()
	require.Eventually(t, func() bool {
		for i, s := range sims {
			if ix.Resident(kvindex.Replica(i)) != s.truth(t).gpu {
				return false
			}
		}
		return true
	}, within, 5*time.Millisecond, "%s: resident block counts agree", stage)
	for i, s := range sims {
		tr := s.truth(t)
		for _, p := range prompts {
			require.Equal(t, tr.prefix(p, 16), indexPrefix(ix, kvindex.Replica(i), p), "%s: replica %d", stage, i)
		}
	}
}

// TestColdStartReplaysBuffer: a manager started after the engines stored
// blocks learns them from the engines' replay buffers at once, with no new
// event.
func TestColdStartReplaysBuffer(t *testing.T) {
	sims := []*replica{startSim(t, func(*sim.Config) {}), startSim(t, func(c *sim.Config) { c.Engine.Flavour = "sglang" })}
	prompts := workload(rand.New(rand.NewPCG(3, 4)), 20)
	for i, p := range prompts {
		sims[i%2].complete(t, p)
	}
	ix := kvindex.New(kvindex.Config{})
	m, err := New(Config{}, 16, ix, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	require.NoError(t, err)
	defer m.Close()
	sources := make([]Source, len(sims))
	for i, s := range sims {
		sources[i] = Source{Replica: kvindex.Replica(i), Name: s.addr, Model: model, Endpoint: s.pub, Replay: s.replay}
	}
	m.Set(sources)
	agrees(t, ix, sims, prompts, 5*time.Second, "after the start replay")
	for i := range sims {
		require.Positive(t, ix.Resident(kvindex.Replica(i)))
	}
}

// TestWarmStartFromSnapshot: manager B starts from manager A's snapshot.
// Replica 0's engine kept its run and stored more since the snapshot: B
// resumes it and replays only what followed. Replica 1's engine restarted
// since: B drops the snapshot's blocks of it, never mixes runs, and
// rebuilds it from the new run's buffer. Replica 2 is in the snapshot but
// no longer in the pool; replica 3 is new. B agrees with every engine
// without any new event after its start.
func TestWarmStartFromSnapshot(t *testing.T) {
	sims := make([]*replica, 4)
	for i := range sims {
		sims[i] = startSim(t, func(c *sim.Config) { c.Engine.NumGPUBlocks = 256 })
	}
	rng := rand.New(rand.NewPCG(5, 6))
	prompts := workload(rng, 40)
	ixA := kvindex.New(kvindex.Config{})
	idsA := kvindex.NewIDs()
	a, err := New(Config{}, 16, ixA, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	require.NoError(t, err)
	defer a.Close()
	sources := make([]Source, len(sims))
	for i, s := range sims {
		id, err := idsA.Assign(s.addr)
		require.NoError(t, err)
		sources[i] = Source{Replica: id, Name: s.addr, Model: model, Endpoint: s.pub, Replay: s.replay}
	}
	a.Set(sources[:3])
	for i, p := range prompts[:30] {
		sims[i%3].complete(t, p)
	}
	agrees(t, ixA, sims[:3], prompts, 10*time.Second, "A follows the engines")

	var buf bytes.Buffer
	hdr := kvindex.SnapshotHeader{BlockSize: 16, Pool: "llm/p"}
	sw := kvindex.NewSnapshotWriter(&buf, hdr)
	require.NoError(t, a.WriteSnapshot(sw))
	require.NoError(t, sw.Close())
	replicas, blocks, skipped := sw.Stats()
	require.Equal(t, 3, replicas)
	require.Positive(t, blocks)
	require.Zero(t, skipped)

	// After the snapshot: replica 0 stores more, replica 1 restarts and
	// serves again, replica 3 serves for the first time.
	for _, p := range prompts[30:35] {
		sims[0].complete(t, p)
	}
	postJSON(t, sims[1].base+"/admin/restart", map[string]any{})
	for _, p := range prompts[35:] {
		sims[1].complete(t, p)
		sims[3].complete(t, p)
	}

	idsB := kvindex.NewIDs()
	snap, err := kvindex.LoadSnapshot(&buf, kvindex.LoadOptions{Want: hdr, Assign: idsB.Assign})
	require.NoError(t, err)
	b, err := New(Config{}, 16, snap.Index, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	require.NoError(t, err)
	defer b.Close()
	reg := prometheus.NewRegistry()
	require.NoError(t, b.Register(reg))
	b.Preload(snap.Replicas)
	sourcesB := []Source{}
	for _, i := range []int{0, 1, 3} {
		id, err := idsB.Assign(sims[i].addr)
		require.NoError(t, err)
		sourcesB = append(sourcesB, Source{Replica: id, Name: sims[i].addr, Model: model, Endpoint: sims[i].pub, Replay: sims[i].replay})
	}
	b.Set(sourcesB)
	gone, ok := idsB.Lookup(sims[2].addr)
	require.True(t, ok)
	require.Zero(t, snap.Index.Resident(gone), "a replica that left the pool is dropped at once")

	// B's ids come from its own IDs: compare by name.
	idOf := func(s *replica) kvindex.Replica { id, _ := idsB.Lookup(s.addr); return id }
	live := []*replica{sims[0], sims[1], sims[3]}
	require.Eventually(t, func() bool {
		for _, s := range live {
			if snap.Index.Resident(idOf(s)) != s.truth(t).gpu {
				return false
			}
		}
		return true
	}, 5*time.Second, 5*time.Millisecond, "B agrees with the engines")
	for _, s := range live {
		tr := s.truth(t)
		for _, p := range prompts {
			require.Equal(t, tr.prefix(p, 16), indexPrefix(snap.Index, idOf(s), p), "replica %s", s.addr)
		}
	}
	require.Equal(t, 1.0, metricValue(t, reg, "omnious_epp_kv_sequence_total", "resume", sims[0].addr))
	require.Zero(t, metricValue(t, reg, "omnious_epp_kv_sequence_total", "resume_failure", sims[0].addr))
	require.Equal(t, 1.0, metricValue(t, reg, "omnious_epp_kv_sequence_total", "resume_failure", sims[1].addr),
		"a restarted engine's replica is not resumed")
	require.Zero(t, metricValue(t, reg, "omnious_epp_kv_sequence_total", "resume", sims[3].addr))
}

// TestPreloadNotAdoptable: a snapshot replica whose source cannot be
// resumed (no replay endpoint, another model, a connecting publisher) is
// dropped from the index when the manager starts, never served.
func TestPreloadNotAdoptable(t *testing.T) {
	toks := prompt(1, 64)
	ix := kvindex.New(kvindex.Config{})
	src := kvindex.NewReplicaState(ix, 0, model)
	hashes := []uint64{1, 2, 3, 4}
	src.ApplyBatch(&kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.KindBlockStored, BlockHashes: hashes, TokenIDs: toks, BlockSize: 16}}})
	for _, tt := range []struct {
		name string
		src  Source
	}{
		{"no replay endpoint", Source{Endpoint: "tcp://127.0.0.1:1"}},
		{"another model", Source{Endpoint: "tcp://127.0.0.1:1", Replay: "tcp://127.0.0.1:2", Model: "other/model"}},
		{"not in the pool", Source{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			sw := kvindex.NewSnapshotWriter(&buf, kvindex.SnapshotHeader{BlockSize: 16})
			require.NoError(t, sw.AddReplica(kvindex.ReplicaTag{Name: "10.0.0.1:8000", Pos: kvevents.Position{Seq: 3}}, src))
			require.NoError(t, sw.Close())
			snap, err := kvindex.LoadSnapshot(&buf, kvindex.LoadOptions{Want: kvindex.SnapshotHeader{BlockSize: 16}})
			require.NoError(t, err)
			require.Equal(t, 4, snap.Index.Resident(0))
			m, err := New(Config{MaxBackoff: time.Millisecond}, 16, snap.Index, zap.NewNop())
			require.NoError(t, err)
			defer m.Close()
			m.Preload(snap.Replicas)
			s := tt.src
			if s.Model == "" {
				s.Model = model
			}
			s.Name = "10.0.0.1:8000"
			var sources []Source
			if s.Endpoint != "" {
				sources = append(sources, s)
			}
			m.Set(sources)
			require.Zero(t, snap.Index.Resident(0))
		})
	}
}

// TestConnectingPublishers: engines that connect to the manager's bound
// socket (llm-d's centralized mode) feed their replicas by topic; a topic
// no source has is counted and creates nothing; a source that leaves is
// purged.
func TestConnectingPublishers(t *testing.T) {
	ix := kvindex.New(kvindex.Config{})
	m, err := New(Config{Bind: "tcp://127.0.0.1:0"}, 16, ix, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	require.NoError(t, err)
	defer m.Close()
	reg := prometheus.NewRegistry()
	require.NoError(t, m.Register(reg))
	addrs := []string{"127.0.0.1:8000", "127.0.0.1:8001"}
	topics := []string{"kv@127.0.0.1:8000@" + model, "kv@127.0.0.1:8001@" + model}
	m.Set([]Source{{Replica: 0, Name: addrs[0], Model: model, Connect: true}, {Replica: 1, Name: addrs[1], Model: model, Connect: true}})
	pubs := make([]*kvevents.Publisher, 3)
	for i, topic := range append(topics, "kv@127.0.0.1:8009@"+model) {
		p, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: m.BoundEndpoint(), Dial: true, Topic: topic, Format: kvevents.FormatMap}, zap.NewNop())
		require.NoError(t, err)
		defer p.Close()
		pubs[i] = p
	}
	// ZMQ drops what is published before the connection is up: publish
	// new chains until each replica shows them.
	for i := range 2 {
		n := 0
		require.Eventually(t, func() bool {
			n++
			toks := prompt(100000*i+1000*n, 32)
			_, err := pubs[i].Publish([]kvevents.Event{{Kind: kvevents.KindBlockStored, BlockHashes: []uint64{uint64(1000*i + 2*n), uint64(1000*i + 2*n + 1)},
				TokenIDs: toks, BlockSize: 16, Medium: "GPU"}})
			require.NoError(t, err)
			time.Sleep(10 * time.Millisecond)
			return indexPrefix(ix, kvindex.Replica(i), toks) == 2
		}, 10*time.Second, time.Millisecond, "events of %s", topics[i])
	}
	require.Eventually(t, func() bool {
		_, err := pubs[2].Publish([]kvevents.Event{{Kind: kvevents.KindBlockStored, BlockHashes: []uint64{7}, TokenIDs: prompt(1, 16), BlockSize: 16}})
		require.NoError(t, err)
		return metricValue(t, reg, "omnious_epp_kv_events_total", "unknown_topic", "bound") > 0
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, 2, ix.Stats().Residencies/2, "only the known replicas hold blocks")
	require.Positive(t, metricValue(t, reg, "omnious_epp_kv_events_total", "applied", addrs[1]))

	m.Set([]Source{{Replica: 0, Name: addrs[0], Model: model, Connect: true}})
	require.Zero(t, ix.Resident(1), "a connecting source that leaves is purged")
	require.Positive(t, ix.Resident(0))
}

// TestForgedPublisher: in bind mode a topic is accepted only on a
// connection from the address it names. An engine publishing another
// endpoint's topic is counted (forged_topic) and creates no index state;
// a connection from an address no connecting source has is closed and
// counted (refused_peer).
func TestForgedPublisher(t *testing.T) {
	ix := kvindex.New(kvindex.Config{})
	m, err := New(Config{Bind: "tcp://127.0.0.1:0"}, 16, ix, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)))
	require.NoError(t, err)
	defer m.Close()
	reg := prometheus.NewRegistry()
	require.NoError(t, m.Register(reg))
	// Only the victim: every connection (from 127.0.0.1) is refused.
	m.Set([]Source{{Replica: 1, Name: "10.0.0.2:8000", Model: model, Connect: true}})
	conn, err := net.Dial("tcp", strings.TrimPrefix(m.BoundEndpoint(), "tcp://"))
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = conn.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "closed by the EPP")
	conn.Close()
	require.Equal(t, 1.0, metricValue(t, reg, "omnious_epp_kv_events_total", "refused_peer", "bound"))

	// The attacker is a connecting engine itself (127.0.0.1:8000) and
	// claims the victim's topic, then sends its own.
	m.Set([]Source{{Replica: 0, Name: "127.0.0.1:8000", Model: model, Connect: true}, {Replica: 1, Name: "10.0.0.2:8000", Model: model, Connect: true}})
	forger, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: m.BoundEndpoint(), Dial: true, Topic: "kv@10.0.0.2:8000@" + model,
		Format: kvevents.FormatMap}, zap.NewNop())
	require.NoError(t, err)
	defer forger.Close()
	own, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: m.BoundEndpoint(), Dial: true, Topic: "kv@127.0.0.1:8000@" + model,
		Format: kvevents.FormatMap}, zap.NewNop())
	require.NoError(t, err)
	defer own.Close()
	toks := prompt(42, 32)
	require.Eventually(t, func() bool {
		for _, p := range []*kvevents.Publisher{forger, own} {
			_, err := p.Publish([]kvevents.Event{{Kind: kvevents.KindBlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: toks, BlockSize: 16, Medium: "GPU"}})
			require.NoError(t, err)
		}
		time.Sleep(10 * time.Millisecond)
		return metricValue(t, reg, "omnious_epp_kv_events_total", "forged_topic", "bound") > 0 && indexPrefix(ix, 0, toks) == 2
	}, 10*time.Second, time.Millisecond)
	require.Zero(t, ix.Resident(1), "the forged topic created no state for the victim")
	require.Zero(t, indexPrefix(ix, 1, toks))
}

// TestNoBindForConnectingSource: a connecting source without a bound
// socket is logged and skipped, not a crash.
func TestNoBindForConnectingSource(t *testing.T) {
	m, err := New(Config{}, 16, kvindex.New(kvindex.Config{}), zap.NewNop())
	require.NoError(t, err)
	defer m.Close()
	m.Set([]Source{{Replica: 0, Name: "10.0.0.1:8000", Model: model, Connect: true}})
	require.Empty(t, m.running)
	_, err = New(Config{Bind: "tcp://256.0.0.1:1"}, 16, kvindex.New(kvindex.Config{}), zap.NewNop())
	require.ErrorContains(t, err, "cannot bind the KV-event socket")
}

func TestTopicAddr(t *testing.T) {
	for topic, want := range map[string]string{
		"kv@10.0.0.1:8000@m":       "10.0.0.1:8000",
		"kv@10.0.0.1:8000@org/m@x": "10.0.0.1:8000",
		"kv@10.0.0.1:8000":         "",
		"kv@@m":                    "",
		"kv-events":                "",
		"":                         "",
	} {
		got, ok := topicAddr([]byte(topic))
		require.Equal(t, want != "", ok, topic)
		require.Equal(t, want, string(got), topic)
	}
	for in, want := range map[string]string{"fd00::1:8000": "[fd00::1]:8000", "[fd00::1]:8000": "[fd00::1]:8000", "[::ffff:10.0.0.1]:80": "10.0.0.1:80"} {
		got, err := canonicalAddr(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got)
	}
}

// FuzzTopicAddr feeds arbitrary topics to the bound socket's topic parser:
// it never panics, and what it accepts is the address between "kv@" and
// the next "@".
func FuzzTopicAddr(f *testing.F) {
	for _, s := range []string{"kv@10.0.0.1:8000@m", "kv@fd00::1:8000@org/m", "kv@[::1]:1@", "kv@", "@@", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, topic []byte) {
		addr, ok := topicAddr(topic)
		if !ok {
			return
		}
		require.True(t, bytes.HasPrefix(topic, append([]byte("kv@"), addr...)))
		require.NotContains(t, string(addr), "@")
		if canon, err := canonicalAddr(string(addr)); err == nil {
			again, err := canonicalAddr(canon)
			require.NoError(t, err)
			require.Equal(t, canon, again, "canonical is a fixed point")
		}
	})
}

func TestApplyLag(t *testing.T) {
	now := time.Unix(1_800_000_000, 500_000_000)
	for _, tc := range []struct {
		name string
		ts   float64
		lag  float64
		ok   bool
	}{
		{"behind", 1_800_000_000.25, 0.25, true},
		{"engine clock ahead", 1_800_000_001, 0, true},
		{"no timestamp", 0, 0, false},
		{"negative timestamp", -1, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lag, ok := applyLag(tc.ts, now)
			require.Equal(t, tc.ok, ok)
			require.InDelta(t, tc.lag, lag, 1e-6)
		})
	}
}
