package ingest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
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
	m := New(Config{}, 16, ix, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
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
	m := New(Config{}, 16, ix, zap.NewNop())
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
