package kvindex

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/omnious/provider-node/engines/kvevents"
	"github.com/omnious/provider-node/internal/cputime"
)

var (
	sinkMatches []Match
	sinkKeys    []Key
)

// lookupFixture is a 32,768-token prompt in 2048 blocks of 16 and an index in
// which replica i of 8 holds the first (i+1)/8 of its blocks.
func lookupFixture() (*Index, Key, []uint32) {
	rng := rand.New(rand.NewPCG(11, 12))
	toks := randTokens(rng, 32768)
	root := RootKey("meta-llama/Llama-3.1-8B-Instruct", "", "")
	keys := AppendBlockKeys(nil, root, toks, 16)
	ix := New(Config{})
	for r := 0; r < 8; r++ {
		ix.Store(Replica(r), TierGPU, keys[:len(keys)*(r+1)/8])
	}
	return ix, root, toks
}

// BenchmarkLookup32k is the per-request cost: key a 32k-token prompt and
// match it against 8 replicas. Target <= 100 µs.
func BenchmarkLookup32k(b *testing.B) {
	ix, root, toks := lookupFixture()
	keys := make([]Key, 0, 2048)
	out := make([]Match, 0, 8)
	b.ReportAllocs()
	start, ops := cputime.Clock(), 0
	for b.Loop() {
		keys = AppendBlockKeys(keys[:0], root, toks, 16)
		out = ix.Match(keys, out)
		ops++
	}
	cputime.Report(b, start, ops)
	if len(out) != 8 {
		b.Fatalf("got %d matches, want 8", len(out))
	}
	sinkMatches = out
}

// BenchmarkHash32k and BenchmarkMatch32k split BenchmarkLookup32k.
func BenchmarkHash32k(b *testing.B) {
	_, root, toks := lookupFixture()
	keys := make([]Key, 0, 2048)
	b.SetBytes(int64(4 * len(toks)))
	b.ReportAllocs()
	start, ops := cputime.Clock(), 0
	for b.Loop() {
		keys = AppendBlockKeys(keys[:0], root, toks, 16)
		ops++
	}
	cputime.Report(b, start, ops)
	sinkKeys = keys
}

func BenchmarkMatch32k(b *testing.B) {
	ix, root, toks := lookupFixture()
	keys := AppendBlockKeys(nil, root, toks, 16)
	out := make([]Match, 0, 8)
	b.ReportAllocs()
	start, ops := cputime.Clock(), 0
	for b.Loop() {
		out = ix.Match(keys, out)
		ops++
	}
	cputime.Report(b, start, ops)
	sinkMatches = out
}

// BenchmarkLookup32kParallel runs the lookup from every core at once (read
// lock only, atomic reference flags).
func BenchmarkLookup32kParallel(b *testing.B) {
	ix, root, toks := lookupFixture()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		keys := make([]Key, 0, 2048)
		out := make([]Match, 0, 8)
		for pb.Next() {
			keys = AppendBlockKeys(keys[:0], root, toks, 16)
			out = ix.Match(keys, out)
		}
	})
}

// BenchmarkIndexMemory indexes 1,000,000 distinct blocks across 8 replicas and
// reports heap bytes per (block, replica) pair. Residency mix: blocks come in
// chains of 64; chain c is held by 1 + c%3 replicas (1, 2 or 3, mean 2)
// starting at replica c%8, so 2,000,000 residencies. Target <= 64 B/residency.
func BenchmarkIndexMemory(b *testing.B) {
	const blocks, chainLen = 1_000_000, 64
	keys := make([]Key, blocks)
	x := uint64(13)
	for i := range keys {
		// splitmix64: distinct, uniformly spread keys like real chain keys.
		x += 0x9E3779B97F4A7C15
		z := (x ^ x>>30) * 0xBF58476D1CE4E5B9
		z = (z ^ z>>27) * 0x94D049BB133111EB
		keys[i] = nonZero(z ^ z>>31)
	}
	var residencies int
	var perRes, acctPerRes, perKey float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		ix := New(Config{MemoryBudget: 1 << 30})
		residencies = 0
		for c := 0; c*chainLen < blocks; c++ {
			chain := keys[c*chainLen : min(blocks, (c+1)*chainLen)]
			for j := 0; j < 1+c%3; j++ {
				ix.Store(Replica((c+j)%8), TierGPU, chain)
				residencies += len(chain)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		st := ix.Stats()
		if st.Evictions != 0 || st.Keys != blocks || st.Residencies != residencies {
			b.Fatalf("unexpected stats %+v", st)
		}
		heap := float64(after.HeapAlloc) - float64(before.HeapAlloc)
		perRes = heap / float64(residencies)
		perKey = heap / float64(blocks)
		acctPerRes = float64(st.Bytes) / float64(residencies)
		runtime.KeepAlive(ix)
	}
	runtime.KeepAlive(keys)
	b.ReportMetric(perRes, "B/residency")
	b.ReportMetric(perKey, "B/block")
	b.ReportMetric(acctPerRes, "accounted-B/residency")
	b.ReportMetric(float64(residencies)/float64(blocks), "replicas/block")
}

// BenchmarkApplyBlockStored decodes and applies vLLM 0.26 (map-encoded)
// batches of 16 chained BlockStored events of 1-4 blocks of 16 tokens and
// reports blocks/s. Target >= 2,000,000 blocks/s on one core. Every block is
// new to the replica; after each pass over the prepared batches the replica
// is reset outside the timer.
func BenchmarkApplyBlockStored(b *testing.B) {
	const nBatches, perBatch, bs = 1024, 16, 16
	rng := rand.New(rand.NewPCG(21, 22))
	payloads := make([][]byte, nBatches)
	blocksIn := make([]int, nBatches)
	var hash uint64 = 1
	var parent uint64
	for i := range payloads {
		batch := kvevents.Batch{TS: 1.7e9 + float64(i), HasDPRank: true}
		for j := 0; j < perBatch; j++ {
			n := 1 + rng.IntN(4)
			ev := kvevents.Event{Kind: kvevents.KindBlockStored, BlockSize: bs, Medium: "GPU"}
			// A new request every few events; otherwise chain on.
			if parent != 0 && rng.IntN(4) != 0 {
				ev.ParentHash, ev.HasParent = parent, true
			}
			for k := 0; k < n; k++ {
				hash++
				ev.BlockHashes = append(ev.BlockHashes, hash*0x9E3779B97F4A7C15)
			}
			parent = ev.BlockHashes[n-1]
			ev.TokenIDs = randTokens(rng, n*bs)
			batch.Events = append(batch.Events, ev)
			blocksIn[i] += n
		}
		var err error
		if payloads[i], err = kvevents.AppendBatch(nil, &batch, kvevents.FormatMap, kvevents.HashUint64); err != nil {
			b.Fatal(err)
		}
	}
	ix := New(Config{})
	rs := NewReplicaState(ix, 0, "meta-llama/Llama-3.1-8B-Instruct")
	var batch kvevents.Batch
	blocks := 0
	b.ReportAllocs()
	i := 0
	var cpu time.Duration
	start := cputime.Clock()
	for b.Loop() {
		if i == nBatches {
			cpu += cputime.Clock() - start
			b.StopTimer()
			rs.Reset()
			i = 0
			b.StartTimer()
			start = cputime.Clock()
		}
		if err := kvevents.DecodeBatch(payloads[i], &batch); err != nil {
			b.Fatal(err)
		}
		rs.ApplyBatch(&batch)
		blocks += blocksIn[i]
		i++
	}
	cpu += cputime.Clock() - start
	b.ReportMetric(float64(blocks)/b.Elapsed().Seconds(), "blocks/s")
	if cpu > 0 {
		b.ReportMetric(float64(blocks)/cpu.Seconds(), "blocks/cpu-s")
	}
	if st := rs.Stats(); st.UnknownParent != 0 || st.Malformed != 0 {
		b.Fatalf("unexpected replica stats %+v", st)
	}
}

// snapshotStates builds replicas replica states of 17,600 blocks each (the
// engine simulator's default cache, Qwen3-32B on 2xH100): chains of 110
// blocks of 16 tokens from Qwen3's 151,936-token vocabulary, the first 10
// of each chain one of 16 system prompts every replica shares.
func snapshotStates(b *testing.B, replicas, perReplica int) []*ReplicaState {
	const chainLen, sharedLen, bs = 110, 10, 16
	rng := rand.New(rand.NewPCG(51, 52))
	tokens := func(n int) []uint32 {
		t := make([]uint32, n)
		for i := range t {
			t[i] = rng.Uint32N(151936)
		}
		return t
	}
	systems := make([][]uint32, 16)
	for i := range systems {
		systems[i] = tokens(sharedLen * bs)
	}
	ix := New(Config{MemoryBudget: 1 << 30})
	states := make([]*ReplicaState, replicas)
	for r := range states {
		s := NewReplicaState(ix, Replica(r), "Qwen/Qwen3-32B")
		hash := uint64(r+1) << 32
		for c := 0; c < perReplica/chainLen; c++ {
			toks := append(append(make([]uint32, 0, chainLen*bs), systems[c%len(systems)]...), tokens((chainLen-sharedLen)*bs)...)
			ev := kvevents.Event{Kind: kvevents.KindBlockStored, BlockSize: bs, Medium: "GPU", TokenIDs: toks}
			for range chainLen {
				hash++
				ev.BlockHashes = append(ev.BlockHashes, hash)
			}
			s.Apply(&ev)
		}
		if st := s.Stats(); st.Blocks != perReplica {
			b.Fatalf("replica %d tracks %d blocks", r, st.Blocks)
		}
		states[r] = s
	}
	return states
}

// writeSnapshot encodes states to w and returns the blocks written.
func writeSnapshot(b *testing.B, w io.Writer, states []*ReplicaState) int {
	sw := NewSnapshotWriter(w, SnapshotHeader{BlockSize: 16})
	for r, s := range states {
		if err := sw.AddReplica(ReplicaTag{Name: fmt.Sprintf("10.0.%d.%d:8000", r/256, r%256)}, s); err != nil {
			b.Fatal(err)
		}
		if err := sw.Flush(); err != nil {
			b.Fatal(err)
		}
	}
	if err := sw.Close(); err != nil {
		b.Fatal(err)
	}
	_, blocks, _ := sw.Stats()
	return blocks
}

// BenchmarkSnapshotWrite is a warm start's cost on the serving EPP: encode
// 8 replicas of 17,600 blocks (each replica's ingestion waits while it is
// encoded).
func BenchmarkSnapshotWrite(b *testing.B) {
	states := snapshotStates(b, 8, 17600)
	var buf bytes.Buffer
	blocks := writeSnapshot(b, &buf, states)
	b.SetBytes(int64(buf.Len()))
	b.ReportAllocs()
	b.ResetTimer()
	writes := 0
	for b.Loop() {
		writeSnapshot(b, io.Discard, states)
		writes++
	}
	b.ReportMetric(float64(blocks*writes)/b.Elapsed().Seconds(), "blocks/s")
	b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(writes*len(states)), "ms/replica")
}

var sinkSnapshot *Snapshot

// heapObjects returns the bytes of heap objects, live or not yet swept.
func heapObjects() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// watchHeap samples heapObjects every 10 ms until the returned function
// is called, which returns the largest sample.
func watchHeap() func() uint64 {
	stop, done := make(chan struct{}), make(chan uint64)
	go func() {
		peak := heapObjects()
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				done <- max(peak, heapObjects())
				return
			case <-t.C:
				peak = max(peak, heapObjects())
			}
		}
	}()
	return func() uint64 {
		close(stop)
		return <-done
	}
}

// BenchmarkSnapshotLoad is a warm start's cost on the receiving EPP:
// decode and verify a snapshot and rebuild its replicas (keys recomputed
// from the token ids, every block stored in a fresh index), for 8 to 1,024
// replicas of 17,600 blocks, and 1,024 replicas of 4,400 (as many blocks
// as 256 full ones: the time follows the blocks, not the replicas). The
// sender's encoding is in the fixture. Target: a 1,024-replica pool's
// snapshot loads in <= 5 s. replicas=1024 (18 M blocks) needs about
// 10 GB: the sender's states, the snapshot and the loaded states.
// MB-peak-heap is the most heap the loads held at once above what was
// live before (sampled every 10 ms), MB-loaded what the last load's
// index and states hold once collected.
func BenchmarkSnapshotLoad(b *testing.B) {
	for _, tc := range []struct {
		replicas, blocks int
		budget           int64
	}{{8, 17600, 0}, {64, 17600, 0}, {256, 17600, 0}, {1024, 4400, 0}, {1024, 17600, 0}, {1024, 17600, DefaultMemoryBudget}} {
		name := fmt.Sprintf("replicas=%d", tc.replicas)
		if tc.blocks != 17600 {
			name += fmt.Sprintf("/blocks=%d", tc.blocks)
		}
		if tc.budget != 0 {
			name += fmt.Sprintf("/budget=%dMiB", tc.budget>>20)
		}
		b.Run(name, func(b *testing.B) {
			var buf bytes.Buffer
			blocks := writeSnapshot(b, &buf, snapshotStates(b, tc.replicas, tc.blocks))
			data := buf.Bytes()
			// 1 GiB holds every key of 1,024 x 17,600; budget= is the
			// EPP's default index.memory_budget, which evicts while loading.
			opts := LoadOptions{Index: Config{MemoryBudget: cmp.Or(tc.budget, 1<<30)}, Want: SnapshotHeader{BlockSize: 16}}
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			runtime.GC()
			base := heapObjects()
			peak := watchHeap()
			b.ResetTimer()
			start, loads := cputime.Clock(), 0
			for b.Loop() {
				sinkSnapshot = nil
				snap, err := LoadSnapshot(bytes.NewReader(data), opts)
				if err != nil {
					b.Fatal(err)
				}
				if snap.Blocks != blocks {
					b.Fatalf("loaded %d blocks of %d", snap.Blocks, blocks)
				}
				sinkSnapshot = snap
				loads++
			}
			cpu := cputime.Clock() - start
			b.ReportMetric(float64(blocks*loads)/b.Elapsed().Seconds(), "blocks/s")
			if cpu > 0 {
				b.ReportMetric(float64(blocks*loads)/cpu.Seconds(), "blocks/cpu-s")
			}
			b.ReportMetric(float64(len(data))/float64(blocks), "B/block")
			b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(loads), "ms/load")
			b.ReportMetric(cpu.Seconds()/float64(loads), "cpu-s/load")
			b.ReportMetric(float64(peak()-base)/1e6, "MB-peak-heap")
			runtime.GC()
			b.ReportMetric(float64(heapObjects()-base)/1e6, "MB-loaded")
			sinkSnapshot = nil
		})
	}
}

// BenchmarkSnapshotHandover is a whole warm start but the network: the
// serving side encodes 1,024 replicas into a pipe while the receiving
// side loads from it, as an EPP streams its snapshot to a starting
// sibling. Both run in this process, so on a machine of two cores they
// share what two EPPs' hosts would each have. Target: <= 5 s, the
// EPP's default warm_start.timeout, for replicas of 17,600 blocks.
func BenchmarkSnapshotHandover(b *testing.B) {
	for _, perReplica := range []int{4400, 17600} {
		b.Run(fmt.Sprintf("replicas=1024/blocks=%d", perReplica), func(b *testing.B) {
			states := snapshotStates(b, 1024, perReplica)
			opts := LoadOptions{Index: Config{MemoryBudget: 1 << 30}, Want: SnapshotHeader{BlockSize: 16}}
			runtime.GC()
			b.ResetTimer()
			start, n, blocks := cputime.Clock(), 0, 0
			for b.Loop() {
				sinkSnapshot = nil
				pr, pw := io.Pipe()
				sent := make(chan int, 1)
				go func() {
					sw := NewSnapshotWriter(pw, SnapshotHeader{BlockSize: 16})
					for r, s := range states {
						err := sw.AddReplica(ReplicaTag{Name: fmt.Sprintf("10.0.%d.%d:8000", r/256, r%256)}, s)
						if err == nil {
							err = sw.Flush()
						}
						if err != nil {
							_ = pw.CloseWithError(err)
							sent <- -1
							return
						}
					}
					_ = pw.CloseWithError(sw.Close())
					_, blocks, _ := sw.Stats()
					sent <- blocks
				}()
				snap, err := LoadSnapshot(pr, opts)
				if err != nil {
					b.Fatal(err)
				}
				if want := <-sent; snap.Blocks != want {
					b.Fatalf("loaded %d blocks of %d", snap.Blocks, want)
				}
				blocks += snap.Blocks
				sinkSnapshot = snap
				n++
			}
			cpu := cputime.Clock() - start
			b.ReportMetric(float64(blocks)/b.Elapsed().Seconds(), "blocks/s")
			b.ReportMetric(cpu.Seconds()/float64(n), "cpu-s/handover")
			b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(n), "ms/handover")
			sinkSnapshot = nil
		})
	}
}

// BenchmarkKeyCache keys 8k-token prompts at block size 16 with and
// without a KeyCache: the same prompt again (warm), a shared 2k-token
// prefix before a suffix no earlier prompt had (shared-2k), and prompts
// the cache never holds (cold: 64 prompts through a cache of four, the
// recording and eviction cost on every block). uncached keys the cold
// prompts without a cache.
func BenchmarkKeyCache(b *testing.B) {
	rng := rand.New(rand.NewPCG(15, 16))
	root := RootKey("m", "", "")
	prompts := make([][]uint32, 64)
	shared := randTokens(rng, 2048)
	for i := range prompts {
		prompts[i] = append(append([]uint32(nil), shared...), randTokens(rng, 8192-2048)...)
	}
	for _, tc := range []struct {
		name   string
		tokens int // cache capacity, 0: uncached
		cycle  int // prompts cycled through
	}{
		{"uncached", 0, 64},
		{"warm", 1 << 20, 1},
		{"shared-2k", 4 * 8192, 64},
		{"cold", 4 * 8192, 64},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var c *KeyCache
			if tc.tokens > 0 {
				var err error
				if c, err = NewKeyCache(tc.tokens, 16); err != nil {
					b.Fatal(err)
				}
			}
			pr := prompts
			if tc.name == "cold" || tc.name == "uncached" {
				// Nothing shared: every prompt is its own.
				pr = make([][]uint32, len(prompts))
				for i := range pr {
					pr[i] = randTokens(rng, 8192)
				}
			}
			keys := make([]Key, 0, 512)
			b.ReportAllocs()
			start, ops := cputime.Clock(), 0
			for b.Loop() {
				toks := pr[ops%tc.cycle]
				if c == nil {
					keys = AppendBlockKeys(keys[:0], root, toks, 16)
				} else {
					keys = c.AppendBlockKeys(keys[:0], root, toks)
				}
				ops++
			}
			cputime.Report(b, start, ops)
			sinkKeys = keys
		})
	}
}
