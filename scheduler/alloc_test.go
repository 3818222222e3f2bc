package scheduler

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/metrics"
)

// TestAllocsPick: in the steady state (the pool, the prompt's records and
// the session known) a decision, from Admit to Release, allocates nothing,
// precise or approximate, with the default two fallbacks and with more.
// It skips under the race detector, which allocates on its own (and makes
// sync.Pool drop what it is given); the Makefile's unit target runs it
// without (-run Allocs).
func TestAllocsPick(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race; run without it (make unit does: go test -run Allocs ./scheduler/)")
	}
	for _, tt := range []struct {
		name      string
		policy    string
		fallbacks int
		text      bool
	}{
		{"precise", PolicyPrecise, 2, false},
		{"precise, five fallbacks", PolicyPrecise, 5, false},
		{"approximate", PolicyApproximate, 2, true},
		{"agent", PolicyAgent, 2, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, 64, func(c *Config) {
				c.Policy = tt.policy
				c.Fallbacks = ptr(tt.fallbacks)
				c.Admission.Enabled = ptr(true)
			})
			prompt := tokens(4096, 7)
			for i := range 64 {
				e.setSignals(i, metrics.Signals{Running: float64(i % 5), Waiting: float64(i % 3), KVUsage: 0.3})
				e.store(i, prompt[:1024*(1+i%3)])
			}
			req := &Request{Model: testModel, Tokens: prompt, SessionKey: "s", Tenant: "t", Arrived: time.Now()}
			if tt.text {
				req.Tokens, req.PromptText = nil, []byte(string(make([]byte, 8192)))
			}
			decide := func() {
				// No require here: its arguments would be boxed, an
				// allocation of the test's own.
				d, err := e.s.admitPick(ctx, req)
				if err != nil || len(d.Endpoints) != 1+tt.fallbacks {
					t.Fatalf("decision %v, error %v", d, err)
				}
				d.Done(DoneInfo{Status: 200, PromptTokens: 4096, CachedTokens: 1024, CompletionTokens: 10})
				d.Release()
			}
			// A sync.Pool drops its contents when GOMAXPROCS changes,
			// which AllocsPerRun does: fill the pools at its setting.
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			for range 10 {
				decide()
			}
			require.Zero(t, testing.AllocsPerRun(200, decide))
		})
	}
}

// TestReleaseBeforeDone: a decision released before it is done is left
// alone; Done still ends it (its in-flight count goes back to zero), and
// a second Release after Done is a no-op.
func TestReleaseBeforeDone(t *testing.T) {
	e := newEnv(t, 2, nil)
	e.freshAll()
	d, err := e.s.Pick(&Request{Model: testModel}, nil)
	require.NoError(t, err)
	r := e.s.snap.Load().byAddr[primary(d)]
	d.Release()
	require.Equal(t, int64(1), r.inflight.Load())
	require.NotNil(t, d.mem, "still the caller's")
	d.Done(DoneInfo{Status: 200})
	require.Zero(t, r.inflight.Load())
	d.Release()
	require.Nil(t, d.mem)
	d.Release()
}
