package chaos

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnious/provider-node/bench/internal/launch"
)

// The warm-start scenario's fleet: eight replicas with vLLM's default KV
// cache for Qwen3-32B on 2×H100 (the simulator's 17,600 blocks), filled by
// distinct long prompts to about half of it, so a new EPP has a large
// index to take over.
const (
	warmReplicas  = 8
	warmGPUBlocks = 17600
	warmPrompts   = 600
	warmWords     = 2000
	warmBound     = time.Second
)

func runEPPWarmStart(ctx context.Context, env *world, o *outcome) error {
	// Fill the caches, the fleet busy, then start a third EPP with the
	// first as its sibling while the last requests are still running.
	var next atomic.Int64
	var failed atomic.Int64
	var wg sync.WaitGroup
	fillCtx, stopFill := context.WithCancel(ctx)
	defer stopFill()
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= warmPrompts || fillCtx.Err() != nil {
					return
				}
				if status, err := env.complete(fillCtx, promptOf(fmt.Sprintf("warm-%d", i), warmWords), 1, ""); (err != nil || status != 200) && fillCtx.Err() == nil {
					failed.Add(1)
				}
			}
		}()
	}
	for next.Load() < warmPrompts*9/10 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	spec := env.spec
	spec.Peers = []string{strings.TrimPrefix(env.epps[0].AdminURL(), "http://")}
	third, err := launch.StartProcess(launch.ProcessConfig{Spec: spec, Bin: env.bins.epp, Dir: filepath.Join(env.dir, "epp-warm"), Name: "EPP 3"})
	if err != nil {
		return err
	}
	started := time.Now()
	defer third.Stop()
	// What the new EPP holds, polled from its start (its admin view is
	// cheap; the engines' full block lists are not, so they are read once
	// the fleet is quiet and the samples compared with them afterwards).
	type sample struct {
		at time.Time
		ix map[string]int
	}
	var samples []sample
	pollCtx, stopPoll := context.WithCancel(ctx)
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for pollCtx.Err() == nil {
			if ix, err := third.ResidentBlocks(pollCtx); err == nil {
				samples = append(samples, sample{time.Now(), ix})
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	wg.Wait()
	o.check(failed.Load() == 0, "%d of %d fill requests failed", failed.Load(), warmPrompts)
	truth := map[string]int{}
	blocks := 0
	for _, p := range env.sims {
		n, err := env.truthBlocks(ctx, p)
		if err != nil {
			stopPoll()
			<-polled
			return err
		}
		truth[p.Addr()], blocks = n, blocks+n
	}
	// One more second of samples past the read, in case the EPP is slower.
	time.Sleep(time.Second)
	stopPoll()
	<-polled
	var took time.Duration
	for _, sm := range samples {
		if holds(sm.ix, truth) {
			took = sm.at.Sub(started)
			break
		}
	}
	if took == 0 {
		last := map[string]int{}
		if len(samples) > 0 {
			last = samples[len(samples)-1].ix
		}
		o.check(false, "the new EPP's index never equalled the engines' (engines %v, EPP %v)", truth, last)
		return nil
	}
	o.see("%d replicas of %d blocks each held %d blocks after %d prompts of %d words; the third EPP, started with the first as its sibling while the fleet was busy, equalled every engine's blocks %d ms after its process started",
		len(env.sims), warmGPUBlocks, blocks, warmPrompts, warmWords, took.Milliseconds())
	// For comparison, an EPP with no sibling on the quiet fleet: it has
	// only what the engines' replay buffers still hold.
	cold := env.spec
	cold.Peers = nil
	e, err := launch.StartProcess(launch.ProcessConfig{Spec: cold, Bin: env.bins.epp, Dir: filepath.Join(env.dir, "epp-cold"), Name: "EPP 4"})
	if err != nil {
		return err
	}
	coldStart := time.Now()
	_, err = waitFor(ctx, 10*time.Second, func() (bool, error) {
		ix, err := e.ResidentBlocks(ctx)
		if err != nil {
			return false, nil
		}
		return holds(ix, truth), nil
	})
	_ = e.Stop()
	if err != nil {
		o.see("an EPP started cold (no sibling) on the quiet fleet did not equal the engines within 10 s")
	} else {
		o.see("one started cold on the quiet fleet, from the engines' replay buffers alone, took %d ms", time.Since(coldStart).Milliseconds())
	}
	o.check(took <= warmBound, "the new EPP took %v to equal the engines (bound %v)", took.Round(time.Millisecond), warmBound)
	o.recovery, o.recoveryOf = took, "process start → index equals every engine"
	return nil
}

// holds reports whether an EPP's resident blocks per endpoint (its admin
// view) are the engines' own counts.
func holds(ix, truth map[string]int) bool {
	for addr, n := range truth {
		if ix[addr] != n {
			return false
		}
	}
	return true
}
