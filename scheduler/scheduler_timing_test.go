package scheduler

import (
	"fmt"
	"testing"
	"time"

	"github.com/omnious/provider-node/internal/cputime"

	"github.com/omnious/provider-node/engines/metrics"
	"github.com/omnious/provider-node/kvindex"
)

var sinkDecision *Decision

// BenchmarkSchedule64 is one precise decision (admission, filters, index
// walk, speculative credit, routing memory, scoring, guard, picker,
// fallbacks, Done, Release) for an 8k-token prompt, tokens already computed. Every
// replica holds the prompt's first 2k tokens (a shared system prompt),
// every eighth one the first 6k, and one the whole prompt. Targets: <= 10 µs
// of CPU at 64 replicas, <= 50 µs at 1,024 (one EPP for a large pool), and
// linear in replicas (the 8 to 1,024 runs).
func BenchmarkSchedule64(b *testing.B) {
	for _, n := range []int{8, 16, 64, 256, 1024} {
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) {
			e := newEnv(b, n, func(c *Config) { c.Admission.Enabled = ptr(true) })
			prompt := tokens(8192, 42)
			for i := range n {
				e.setSignals(i, metrics.Signals{Running: float64(i % 5), Waiting: float64(i % 3), KVUsage: 0.3 + float64(i%4)/10})
				switch {
				case i == n/2:
					e.store(i, prompt)
				case i%8 == 0:
					e.store(i, prompt[:6144])
				default:
					e.store(i, prompt[:2048])
				}
			}
			req := &Request{Model: testModel, Tokens: prompt, Arrived: time.Now()}
			b.ReportAllocs()
			start, ops := cputime.Clock(), 0
			for b.Loop() {
				d, err := e.s.admitPick(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				sinkDecision = d
				d.Done(DoneInfo{Status: 200})
				d.Release()
				ops++
			}
			cputime.Report(b, start, ops)
		})
	}
}

// BenchmarkKeying isolates the part of a precise decision that does not
// depend on the number of replicas: keying 8k tokens and walking the index.
func BenchmarkKeying(b *testing.B) {
	ix := kvindex.New(kvindex.Config{})
	prompt := tokens(8192, 42)
	root := kvindex.RootKey(testModel, "", "")
	keys := kvindex.AppendBlockKeys(nil, root, prompt, 16)
	ix.Store(1, kvindex.TierGPU, keys)
	out := make([]kvindex.Match, 0, 8)
	b.ReportAllocs()
	start, ops := cputime.Clock(), 0
	for b.Loop() {
		keys = kvindex.AppendBlockKeys(keys[:0], root, prompt, 16)
		out = ix.Match(keys, out)
		ops++
	}
	cputime.Report(b, start, ops)
}

func BenchmarkKeyingOnly(b *testing.B) {
	prompt := tokens(8192, 42)
	root := kvindex.RootKey(testModel, "", "")
	keys := kvindex.AppendBlockKeys(nil, root, prompt, 16)
	start, ops := cputime.Clock(), 0
	for b.Loop() {
		keys = kvindex.AppendBlockKeys(keys[:0], root, prompt, 16)
		ops++
	}
	cputime.Report(b, start, ops)
}

// BenchmarkScheduleNoPrefix is the replica-dependent part alone (admission,
// filters, scorers, guard, picker, Done) with no prompt to match, to show
// the per-replica cost is linear.
func BenchmarkScheduleNoPrefix(b *testing.B) {
	for _, n := range []int{8, 16, 64} {
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) {
			e := newEnv(b, n, func(c *Config) { c.Admission.Enabled = ptr(true) })
			for i := range n {
				e.setSignals(i, metrics.Signals{Running: float64(i % 5), Waiting: float64(i % 3), KVUsage: 0.3 + float64(i%4)/10})
			}
			req := &Request{Model: testModel}
			b.ReportAllocs()
			start, ops := cputime.Clock(), 0
			for b.Loop() {
				d, err := e.s.admitPick(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				sinkDecision = d
				d.Done(DoneInfo{Status: 200})
				d.Release()
				ops++
			}
			cputime.Report(b, start, ops)
			b.ReportMetric(float64(cputime.Clock()-start)/float64(max(ops, 1))/float64(n), "cpu-ns/replica")
		})
	}
}
