package vllm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/engines/kvevents"
	"github.com/omnious/provider-node/engines/metrics"
	"github.com/omnious/provider-node/engines/sim"
	"github.com/omnious/provider-node/internal/testutil/freeport"
)

// chainEvent is a KV event with the engine's hashes replaced by what a
// block is: the tokens from the root to its end. Two engines hash blocks
// differently; they agree when they store and remove the same chains in
// the same order.
type chainEvent struct {
	kind   kvevents.Kind
	blocks []string // each block's chain, as "len:digest" of its tokens
	parent string   // the parent block's chain, "" at the root
}

func (e chainEvent) String() string {
	return fmt.Sprintf("%s%v<-%s", e.kind, e.blocks, e.parent)
}

// chains turns decoded batches into chain events, checking on the way that
// every event names blocks the engine had stored.
func chains(t *testing.T, who string, payloads [][]byte) []chainEvent {
	t.Helper()
	byHash := map[uint64][]uint32{}
	saltOf := map[uint64]string{} // the cache_salt at the block's root
	name := func(tokens []uint32, salt string) string {
		return fmt.Sprintf("%d:%x%s", len(tokens), fnv(tokens), salt)
	}
	var out []chainEvent
	var b kvevents.Batch
	for _, p := range payloads {
		require.NoError(t, kvevents.DecodeBatch(p, &b), "%s: a batch our decoder refuses", who)
		require.Zero(t, b.Unknown, "%s: events of an unknown type", who)
		for _, ev := range b.Events {
			ce := chainEvent{kind: ev.Kind}
			switch ev.Kind {
			case kvevents.KindBlockStored:
				require.Equal(t, blockSize, ev.BlockSize, "%s: block_size", who)
				require.Len(t, ev.TokenIDs, blockSize*len(ev.BlockHashes), "%s: token ids of %d blocks", who, len(ev.BlockHashes))
				require.Zero(t, ev.Opaque, "%s: blocks with keys no request maps to", who)
				var prefix []uint32
				salt := ""
				if ev.CacheSalt != "" {
					salt = "@" + ev.CacheSalt
				}
				if ev.HasParent {
					var ok bool
					prefix, ok = byHash[ev.ParentHash]
					require.True(t, ok, "%s: a block stored under a parent never stored", who)
					salt = saltOf[ev.ParentHash]
					ce.parent = name(prefix, salt)
				}
				for i, h := range ev.BlockHashes {
					chain := append(slices.Clone(prefix), ev.TokenIDs[i*blockSize:(i+1)*blockSize]...)
					byHash[h], saltOf[h] = chain, salt
					ce.blocks = append(ce.blocks, name(chain, salt))
					prefix = chain
				}
			case kvevents.KindBlockRemoved:
				for _, h := range ev.BlockHashes {
					chain, ok := byHash[h]
					require.True(t, ok, "%s: a block removed that was never stored", who)
					ce.blocks = append(ce.blocks, name(chain, saltOf[h]))
				}
			case kvevents.KindAllBlocksCleared:
				clear(byHash)
				clear(saltOf)
			}
			out = append(out, ce)
		}
	}
	return out
}

func fnv(tokens []uint32) uint64 {
	h := uint64(14695981039346656037)
	for _, v := range tokens {
		h ^= uint64(v)
		h *= 1099511628211
	}
	return h
}

// fidelityPrompts are token-id prompts (the same ids for both engines,
// whatever their tokenizers): families sharing a prefix, each a whole
// number of blocks, so that the one generated token never fills a block,
// and together several times the 256 blocks a cache holds.
func fidelityPrompts() [][]uint32 {
	rng := rand.New(rand.NewPCG(53, 5))
	var out [][]uint32
	for range 12 {
		shared := make([]uint32, blockSize*(4+rng.IntN(8)))
		for i := range shared {
			shared[i] = uint32(1000 + rng.IntN(50000))
		}
		for range 4 {
			p := slices.Clone(shared)
			for range blockSize * (1 + rng.IntN(6)) {
				p = append(p, uint32(1000+rng.IntN(50000)))
			}
			out = append(out, p)
		}
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// runSequence sends prompts one at a time, each generating one token;
// every third carries a cache_salt (one of two), which both engines must
// report at the root of the blocks it stores.
func runSequence(t *testing.T, base string, prompts [][]uint32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for i, p := range prompts {
		body := map[string]any{"model": model, "prompt": p, "max_tokens": 1, "temperature": 0}
		if i%3 == 2 {
			body["cache_salt"] = []string{"tenant-a", "tenant-b"}[i/3%2]
		}
		require.NoError(t, postJSON(ctx, base+"/v1/completions", body, nil))
	}
}

// collector subscribes to a PUB endpoint and keeps every payload.
type collector struct {
	sock zmq4.Socket
	mu   sync.Mutex
	msgs [][]byte
	done chan struct{}
}

func collect(t *testing.T, endpoint string) *collector {
	t.Helper()
	c := &collector{sock: zmq4.NewSub(context.Background()), done: make(chan struct{})}
	require.NoError(t, c.sock.SetOption(zmq4.OptionSubscribe, ""))
	require.NoError(t, c.sock.Dial(endpoint))
	go func() {
		defer close(c.done)
		for {
			msg, err := c.sock.Recv()
			if err != nil {
				return
			}
			if _, _, payload, err := kvevents.ParseMessage(msg.Frames); err == nil {
				c.mu.Lock()
				c.msgs = append(c.msgs, payload)
				c.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { _ = c.sock.Close(); <-c.done })
	return c
}

func (c *collector) payloads() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.msgs)
}

// families is the set of metric family names (vllm:*) an exposition has.
func families(body []byte) []string {
	set := map[string]bool{}
	for _, line := range strings.Split(string(body), "\n") {
		if name, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, _, _ = strings.Cut(name, " ")
			// prometheus_client's *_created series are start times, not data.
			if strings.HasPrefix(name, "vllm:") && !strings.HasSuffix(name, "_created") {
				set[name] = true
			}
		}
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// TestSimulatorFidelity: the same request sequence, under eviction
// pressure, sent to real vLLM and to enginesim configured alike (block
// size 32, vLLM's 256 blocks less its null block) gives the same KV events: the same blocks stored
// under the same parents with the same token ids, the same blocks
// removed, in the same order. The simulator serves every vLLM metric
// family the scraper reads (the rest are listed in engines/sim/README.md).
func TestSimulatorFidelity(t *testing.T) {
	f := getFleet(t)
	prompts := fidelityPrompts()

	// Real vLLM: replica 0 after a cache reset. vLLM publishes the reset's
	// AllBlocksCleared with the events of its next step, the sequence's
	// first.
	r := f.replicas[0]
	f.settle(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, postJSON(ctx, r.base()+"/reset_prefix_cache", nil, nil))
	r.relay.record()
	runSequence(t, r.base(), prompts)
	f.settle(t)
	var real [][]byte
	for _, m := range r.relay.recorded() {
		real = append(real, m.payload)
	}
	realEvents := chains(t, "vllm", real)
	require.NotEmpty(t, realEvents)
	require.Equal(t, kvevents.KindAllBlocksCleared, realEvents[0].kind, "vLLM's first event after the reset")
	realEvents = realEvents[1:]
	if dir := os.Getenv("E2E_VLLM_SAVE"); dir != "" {
		var all []byte
		for _, p := range real {
			all = append(all, fmt.Appendf(nil, "%x\n", p)...)
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, "kvevents-vllm.hex"), all, 0o644))
	}

	// enginesim, configured as the replica.
	ports, err := freeport.Take(2)
	require.NoError(t, err)
	cfg := sim.Config{Listen: fmt.Sprintf("127.0.0.1:%d", ports[0]), Model: model, MaxModelLen: maxModelLen}
	cfg.Engine.BlockSize = blockSize
	// vLLM's own num_gpu_blocks: the simulator's vllm flavour counts the
	// null block vLLM never allocates (engines/sim/README.md, "Fidelity
	// to vLLM").
	cfg.Engine.NumGPUBlocks = kvCacheBytes / 512 / blockSize
	cfg.Engine.MaxNumSeqs = 16
	cfg.Engine.MaxNumBatchedTokens = 2048
	cfg.KVEvents.Endpoint = fmt.Sprintf("tcp://127.0.0.1:%d", ports[1])
	cfg = cfg.WithDefaults()
	require.NoError(t, cfg.Validate())
	sr, err := sim.NewReplica(cfg, 0, zap.NewNop())
	require.NoError(t, err)
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sr.Run(sctx) }()
	t.Cleanup(func() { stop(); <-done })
	pub, _ := sr.KVEndpoints()
	c := collect(t, pub)
	time.Sleep(500 * time.Millisecond) // the subscription reaches the publisher
	base := (&url.URL{Scheme: "http", Host: sr.Addr()}).String()
	runSequence(t, base, prompts)
	time.Sleep(time.Second)
	simEvents := chains(t, "enginesim", c.payloads())

	removed := 0
	for _, e := range realEvents {
		if e.kind == kvevents.KindBlockRemoved {
			removed += len(e.blocks)
		}
	}
	require.Positive(t, removed, "vLLM evicted nothing: the sequence puts no pressure on the cache")
	salted := 0
	for _, e := range realEvents {
		if e.kind == kvevents.KindBlockStored && e.parent == "" && strings.Contains(e.blocks[0], "@tenant-") {
			salted++
		}
	}
	require.Positive(t, salted, "vLLM reported no salted root: the salted prompts test nothing")
	t.Logf("vLLM: %d events, %d blocks removed; enginesim: %d events", len(realEvents), removed, len(simEvents))
	require.Equal(t, flatten(realEvents), flatten(simEvents), "the simulator's KV events differ from vLLM's")

	realFams := families(get(t, r.base()+"/metrics"))
	simFams := families(get(t, base+"/metrics"))
	var s metrics.Signals
	require.NoError(t, metrics.Parse(get(t, base+"/metrics"), &s))
	var missing []string
	for _, fam := range realFams {
		if !slices.Contains(simFams, fam) {
			missing = append(missing, fam)
		}
	}
	t.Logf("vLLM families the simulator does not serve: %v", missing)
	for _, fam := range readFamilies {
		require.Contains(t, realFams, fam, "vLLM no longer serves a family the scraper reads")
		require.Contains(t, simFams, fam, "the simulator does not serve a family the scraper reads")
	}
}

// readFamilies are the vLLM families engines/metrics reads.
var readFamilies = []string{
	"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
	"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
	"vllm:cache_config_info", "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
}

// flatten is the event sequence with batch boundaries dropped: one line
// per block stored or removed, which both engines must give in order.
func flatten(evs []chainEvent) []string {
	var out []string
	for _, e := range evs {
		switch e.kind {
		case kvevents.KindBlockStored:
			parent := e.parent
			for _, b := range e.blocks {
				out = append(out, "stored "+b+" <- "+parent)
				parent = b
			}
		case kvevents.KindBlockRemoved:
			for _, b := range e.blocks {
				out = append(out, "removed "+b)
			}
		default:
			out = append(out, e.kind.String())
		}
	}
	return out
}
