package kvindex

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/omnious/provider-node/internal/cputime"
)

// BenchmarkStoreShared is the live write path on blocks many replicas
// hold: each of replicas=N holds the same 16 system prompts of 10
// blocks, and an op is one replica freeing one prompt's blocks and
// storing them again (an engine evicting and recomputing it): 10
// removals and 10 stores, each of a key N replicas hold.
func BenchmarkStoreShared(b *testing.B) {
	for _, n := range []int{64, 1024} {
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			prompts := make([][]Key, 16)
			for i := range prompts {
				prompts[i] = AppendBlockKeys(nil, RootKey(testModel, "", ""), randTokens(rng, 160), 16)
			}
			ix := New(Config{})
			for r := range n {
				for _, p := range prompts {
					ix.Store(Replica(r), TierGPU, p)
				}
			}
			b.ReportAllocs()
			i := 0
			start := cputime.Clock()
			for b.Loop() {
				r, p := Replica(i%n), prompts[(i/n)%len(prompts)]
				ix.Remove(r, TierGPU, p)
				ix.Store(r, TierGPU, p)
				i++
			}
			cputime.Report(b, start, i)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(20*i), "ns/key")
			if got := ix.Stats().Residencies; got != n*160 {
				b.Fatalf("%d residencies, want %d", got, n*160)
			}
		})
	}
}
