package scheduler

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// TestConcurrentPickAndUpdate races decisions, completions, pool updates and
// gauge refreshes (run with -race) and checks the in-flight accounting
// balances at the end.
func TestConcurrentPickAndUpdate(t *testing.T) {
	e := newEnv(t, 8, func(c *Config) { c.Admission.Enabled = ptr(true) })
	e.freshAll()
	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	eps := endpoints(8, testModel)
	for i := range eps {
		eps[i].MetricsURL = ""
	}
	e.s.SetEndpoints(eps)
	go func() { _ = e.s.Run(runCtx) }()

	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				req := &Request{Model: testModel, Tokens: tokens(256+i%7*16, uint32(i%5)), SessionKey: "s", Band: "platinum"}
				if g%2 == 1 {
					req.Tokens, req.PromptText = nil, []byte("hello world, this is a prompt of some length")
				}
				d, err := e.s.admitPick(context.Background(), req)
				if err != nil {
					t.Error(err)
					return
				}
				d.Done(DoneInfo{Served: d.Endpoints[0].Addr, Status: 200, PromptTokens: 5})
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 50 {
			n := 4 + i%5
			e.s.SetEndpoints(eps[:n])
			_ = e.s.Capacity()
			e.s.refreshGauges()
			time.Sleep(time.Millisecond)
		}
		e.s.SetEndpoints(eps)
	}()
	wg.Wait()
	for _, r := range e.s.snap.Load().all.reps {
		require.Zero(t, r.inflight.Load(), r.ep.Addr)
	}
	require.Equal(t, int64(4*300*5), int64(testutil.ToFloat64(e.s.m.tenantTokens.WithLabelValues(defaultTenant, "prompt"))))
}
