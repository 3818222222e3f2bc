package chaos

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/omnious/provider-node/bench/internal/launch"
	"github.com/omnious/provider-node/scheduler"
)

// scenarios is the suite, in the order it runs. Each expected outcome is
// what run checks; the bounds derive from the chaos fleet's timings
// (env.go), not from a previous run's numbers.
func scenarios() []scenario {
	threshold := launch.BreakerThreshold()
	// A dead replica's scrapes fail at once (connection refused), so the
	// breaker opens after threshold scrapes; the gauge the harness reads
	// is refreshed once per interval.
	openBound := time.Duration(threshold+1)*scrapeInterval + scrapeTimeout
	// A hanging scrape takes the timeout to fail.
	hangOpenBound := time.Duration(threshold)*(scrapeInterval+scrapeTimeout) + scrapeInterval
	return []scenario{
		{
			name: "engine-kill",
			expected: fmt.Sprintf("SIGKILL mid-stream: client gets a truncated stream (no [DONE]) within 2 s, no retry; "+
				"breaker opens and new requests avoid the replica within %v; restarted on the same port, it serves again",
				openBound),
			setup: setup{replicas: 3},
			run: func(ctx context.Context, env *world, o *outcome) error {
				return runEngineKill(ctx, env, o, openBound)
			},
		},
		{
			name: "client-cancel",
			expected: "1,000 requests cancelled before the routing reply, at the response headers or mid-body, mixed with " +
				"300 normal ones: every normal one served, no breaker leaves closed, no request counts as a failure, " +
				"each replica's share within " + strconv.Itoa(maxShareShift) + " points of a run without cancels, nothing in flight afterwards",
			setup: setup{replicas: 3},
			run:   runClientCancel,
		},
		{
			name: "no-response-phase",
			expected: "300 requests through a gateway with response processing off (the EPP sees only its streams end): " +
				"all served, no breaker leaves closed, no failure counted, shares within " + strconv.Itoa(maxShareShift) + " points of the same load " +
				"with a response phase, nothing in flight afterwards",
			setup: setup{replicas: 3},
			run:   runNoResponsePhase,
		},
		{
			name: "engine-crash-idle",
			expected: fmt.Sprintf("SIGKILL of a replica serving nothing (no load signal keeps requests away): requests "+
				"routed to it fail until its breaker opens, then none do; all of that within %v", openBound),
			setup: setup{replicas: 3},
			run: func(ctx context.Context, env *world, o *outcome) error {
				return runCrashIdle(ctx, env, o, openBound)
			},
		},
		{
			name: "engine-restart",
			expected: "POST /admin/restart: the replica's index entries are cleared, the next request for its " +
				"cached prefix is not routed by prefix (nothing stale), the index is rebuilt from new events",
			setup: setup{replicas: 2},
			run:   runEngineRestart,
		},
		{
			name: "event-gap",
			expected: "drop-events with replay: the gap is replayed and the index equals /admin/blocks, no reset; " +
				"without replay: the replica is reset (its older entries dropped, nothing guessed) and rebuilt",
			setup: setup{replicas: 2, noReplay: []int{1}},
			run:   runEventGap,
		},
		{
			name: "kv-publisher-outage",
			expected: "the KV-event publisher vanishes for 1.5 s while the engine serves: the subscriber " +
				"reconnects, replays the gap, no reset; index equals /admin/blocks within max_backoff (5 s) of its return",
			setup: setup{replicas: 2},
			run:   runPublisherOutage,
		},
		{
			name: "metrics-hang",
			expected: fmt.Sprintf("GET /metrics hangs on one replica: every request is still served; the replica turns "+
				"stale and its breaker opens within %v; it is back (fresh, closed) within cooldown + 2 s of the fix", hangOpenBound),
			setup: setup{replicas: 3},
			run: func(ctx context.Context, env *world, o *outcome) error {
				return runMetricsHang(ctx, env, o, hangOpenBound)
			},
		},
		{
			name:     "all-stale",
			expected: "every replica's metrics hang at once (all stale, all breakers open): every request is still served",
			setup:    setup{replicas: 3},
			run:      runAllStale,
		},
		{
			name: "epp-restart",
			expected: "EPP stopped and restarted under load: requests fail closed (gateway 500) only while it is down, " +
				"serve within 5 s of its return; the index refills and prefix routing returns to its earlier share",
			setup: setup{replicas: 3},
			run:   runEPPRestart,
		},
		{
			name: "epp-kill-one-of-two",
			expected: fmt.Sprintf("two bin/epp processes behind one gateway (health checks every %v, a host down after %d "+
				"failures or at once when a stream cannot open), %d streaming clients; SIGKILL of one: failed requests ≤ the "+
				"streams open on it from the signal until the process is gone, none sent after that fails, none fails after "+
				"those streams ended; the survivor's prefix share over %v after the kill within 5 points of the %v before",
				eppHealthInterval, gatewayUnhealthy(), replicaClients, replicaWindow, replicaWindow),
			setup: setup{replicas: 3, eppProcesses: 2},
			run:   runEPPKillOneOfTwo,
		},
		{
			name: "epp-rollout",
			expected: fmt.Sprintf("the same two EPPs and load, restarted one after the other as a rolling update does "+
				"(SIGTERM, exit, start on the same ports, ready: SERVING and every replica healthy, then the next; "+
				"health checks every %v): no request fails at any point; each EPP's time to be ready again is reported",
				eppHealthInterval),
			setup: setup{replicas: 3, eppProcesses: 2},
			run:   runEPPRollout,
		},
		{
			name: "epp-warm-start",
			expected: fmt.Sprintf("a third EPP started against a busy %d-replica fleet (%d KV blocks each, filled by distinct prompts) "+
				"with one of the two running EPPs as its sibling: its index equals every engine's /admin/blocks within %v of its process start",
				warmReplicas, warmGPUBlocks, warmBound),
			setup: setup{replicas: warmReplicas, eppProcesses: 2, gpuBlocks: warmGPUBlocks},
			run:   runEPPWarmStart,
		},
		{
			name: "quoter-flap",
			expected: "replica health flaps 0.7 s down / 0.7 s up: no quote signed or served while the EPP reports " +
				"no healthy replica; the hold-down (1 s, doubling) keeps the breaker from closing in every healthy window",
			// The EPP's own breaker follows the replica closely here, so
			// that the quoter's hold-down is what damps the flapping.
			setup: setup{replicas: 1, cooldown: 300 * time.Millisecond},
			run:   runQuoterFlap,
		},
	}
}

func runEngineKill(ctx context.Context, env *world, o *outcome, openBound time.Duration) error {
	victim := env.sims[0]
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	first := make(chan struct{})
	res := make(chan streamResult, 1)
	// 3000 tokens at time scale 10 stream for about 3 s of wall time.
	go func() { res <- env.stream(sctx, promptOf("kill-stream", 100), 3000, victim.Addr(), first) }()
	select {
	case <-first:
	case r := <-res:
		return fmt.Errorf("the stream ended before the kill: status %d, %d chunks, %v", r.status, r.chunks, r.err)
	case <-time.After(15 * time.Second):
		return fmt.Errorf("no first chunk within 15s")
	}
	time.Sleep(100 * time.Millisecond) // a few chunks on the wire
	pr := env.startProber(ctx, "kill-probe", 40*time.Millisecond, 2, nil)
	defer pr.stop()
	tKill := time.Now()
	if err := victim.Kill(); err != nil {
		return err
	}
	openAfter, openErr := waitFor(ctx, 5*time.Second, func() (bool, error) { return env.breaker(victim.Addr()) == scheduler.BreakerOpen, nil })
	var r streamResult
	select {
	case r = <-res:
	case <-time.After(10 * time.Second):
		scancel()
		r = <-res
		o.check(false, "the client's stream did not end within 10 s of the kill")
	}
	errAfter := r.ended.Sub(tKill)
	o.see("client: %d chunks then %v after %d ms (no [DONE]: %v)", r.chunks, errOrEOF(r.err), errAfter.Milliseconds(), !r.done)
	o.check(!r.done && r.chunks < 3000, "the stream completed: a retry spliced another replica's output in")
	o.check(r.err != nil, "the truncated stream ended without a transport error: the client cannot tell it from a complete one")
	o.check(errAfter <= 2*time.Second, "the client's error came %v after the kill", errAfter)
	if openErr != nil {
		o.check(false, "breaker did not open: %v", openErr)
	} else {
		o.see("breaker open after %d ms", openAfter.Milliseconds())
		o.check(openAfter <= openBound, "breaker opened after %v (bound %v)", openAfter, openBound)
	}
	// Let probes run past the breaker's opening, then see which failed.
	time.Sleep(time.Until(tKill.Add(openBound + time.Second)))
	var lastFail time.Time
	for _, p := range pr.snapshot() {
		if !p.at.Before(tKill) && !p.ok() {
			lastFail = p.at
		}
	}
	failed, total := failures(pr.snapshot(), tKill)
	avoid := time.Duration(0)
	if !lastFail.IsZero() {
		avoid = lastFail.Sub(tKill)
	}
	o.see("%d of %d requests after the kill failed, the last sent %d ms after it", failed, total, avoid.Milliseconds())
	o.check(avoid <= openBound, "requests were still routed to the dead replica %v after the kill", avoid)

	// The replica comes back on the same ports; a probe through the
	// half-open breaker closes it.
	tRestart := time.Now()
	if err := victim.Start(ctx); err != nil {
		return err
	}
	o.see("process restarted in %d ms", time.Since(tRestart).Milliseconds())
	back, err := waitFor(ctx, cooldown+10*time.Second, func() (bool, error) {
		return env.breaker(victim.Addr()) == scheduler.BreakerClosed, nil
	})
	if err != nil {
		o.check(false, "breaker did not close after the restart: %v", err)
		return nil
	}
	back = time.Since(tRestart)
	o.see("breaker closed %d ms after the restart", back.Milliseconds())
	o.recovery, o.recoveryOf = back, "restart → breaker closed"
	// Its index entries from before the crash are gone: the new process's
	// sequence restarted, so the subscriber reset the replica.
	if _, err := waitFor(ctx, 10*time.Second, func() (bool, error) {
		if _, err := env.complete(ctx, promptOf(fmt.Sprintf("kill-after-%d", time.Now().UnixNano()), 40), 1, victim.Addr()); err != nil {
			return false, err
		}
		ok, _, _, err := env.agrees(ctx, victim)
		return ok, err
	}); err != nil {
		_, ix, tr, _ := env.agrees(ctx, victim)
		o.check(false, "index of the restarted replica (%d blocks) never agreed with /admin/blocks (%d): %v", ix, tr, err)
	}
	before := len(pr.snapshot())
	time.Sleep(500 * time.Millisecond)
	ps := pr.stop()
	failedAfter, totalAfter := failures(ps[before:], time.Time{})
	o.check(totalAfter > 0 && failedAfter == 0, "%d of %d requests failed after recovery", failedAfter, totalAfter)
	return nil
}

// runCrashIdle kills a replica that holds no request, so nothing in its
// last metrics sample argues against it: only failed requests and failed
// scrapes can keep traffic away.
func runCrashIdle(ctx context.Context, env *world, o *outcome, openBound time.Duration) error {
	victim := env.sims[1]
	pr := env.startProber(ctx, "idle-probe", 30*time.Millisecond, 2, nil)
	defer pr.stop()
	time.Sleep(500 * time.Millisecond)
	tKill := time.Now()
	if err := victim.Kill(); err != nil {
		return err
	}
	opened, err := waitFor(ctx, 5*time.Second, func() (bool, error) { return env.breaker(victim.Addr()) == scheduler.BreakerOpen, nil })
	o.check(err == nil && opened <= openBound, "breaker open after %v (bound %v): %v", opened, openBound, err)
	time.Sleep(time.Until(tKill.Add(openBound + time.Second)))
	ps := pr.stop()
	var lastFail time.Time
	for _, p := range ps {
		if !p.end.Before(tKill) && !p.ok() {
			lastFail = p.at
		}
	}
	failedBefore := 0 // ended before the kill: the fleet was healthy
	for _, p := range ps {
		if p.end.Before(tKill) && !p.ok() {
			failedBefore++
		}
	}
	failed, total := 0, 0
	for _, p := range ps {
		if !p.end.Before(tKill) {
			total++
			if !p.ok() {
				failed++
			}
		}
	}
	avoid := max(lastFail.Sub(tKill), 0) // a request in flight at the kill counts as 0
	if lastFail.IsZero() {
		avoid = 0
	}
	o.see("breaker open after %d ms; %d of %d requests after the kill failed (503 from the gateway), the last sent %d ms after it",
		opened.Milliseconds(), failed, total, avoid.Milliseconds())
	o.check(failedBefore == 0, "%d requests failed before the kill", failedBefore)
	o.check(avoid <= openBound, "requests were still routed to the dead replica %v after the kill (bound %v)", avoid, openBound)
	o.check(total > failed, "no request succeeded after the kill")
	// Luck may route nothing to it before the scrapes trip the breaker;
	// the breaker's opening is always there to measure.
	o.recovery, o.recoveryOf = opened, "kill → breaker open"
	return nil
}

func errOrEOF(err error) string {
	if err == nil {
		return "clean EOF"
	}
	return err.Error()
}

// prefixDecisions is the EPP's count of decisions routed by prefix.
func (env *world) prefixDecisions() float64 {
	v, _ := env.metric("omnious_epp_decisions_total", map[string]string{"reason": scheduler.ReasonPrefix})
	return v
}

func (env *world) allDecisions() float64 {
	v, _ := env.metric("omnious_epp_decisions_total", nil)
	return v
}

func runEngineRestart(ctx context.Context, env *world, o *outcome) error {
	shared := promptOf("restart-shared", 300)
	for i := 0; i < 3; i++ {
		if st, err := env.complete(ctx, shared+fmt.Sprintf(" question %d", i), 4, ""); err != nil || st != http.StatusOK {
			return fmt.Errorf("warm-up request: status %d: %v", st, err)
		}
	}
	var victim *launch.Sim
	for _, p := range env.sims {
		n, err := env.indexBlocks(ctx, p.Addr())
		if err != nil {
			return err
		}
		if n > 0 {
			if victim != nil {
				return fmt.Errorf("the shared prefix was routed to more than one replica")
			}
			victim = p
		}
	}
	if victim == nil {
		return fmt.Errorf("no replica holds the shared prefix in the index")
	}
	time.Sleep(400 * time.Millisecond) // past the speculative TTL: only the index speaks
	if ok, ix, tr, err := env.agrees(ctx, victim); err != nil || !ok {
		return fmt.Errorf("index (%d) and engine (%d) differ before the restart: %v", ix, tr, err)
	}
	held, _ := env.indexBlocks(ctx, victim.Addr())
	prefix0 := env.prefixDecisions()
	tRestart := time.Now()
	if err := env.post(ctx, victim.URL()+"/admin/restart", `{}`); err != nil {
		return err
	}
	cleared, err := waitFor(ctx, 5*time.Second, func() (bool, error) {
		n, err := env.indexBlocks(ctx, victim.Addr())
		return n == 0, err
	})
	if err != nil {
		o.check(false, "index entries not cleared: %v", err)
		return nil
	}
	cleared = time.Since(tRestart) // including the admin call
	o.see("%d index blocks cleared %d ms after the restart", held, cleared.Milliseconds())
	if st, err := env.complete(ctx, shared+" question 9", 4, ""); err != nil || st != http.StatusOK {
		return fmt.Errorf("request after restart: status %d: %v", st, err)
	}
	stale := env.prefixDecisions() - prefix0
	o.see("prefix-routed decisions for the evicted prefix: %.0f", stale)
	o.check(stale == 0, "the request for the evicted prefix was routed by prefix (stale index)")
	if st, err := env.complete(ctx, shared+" question 10", 4, ""); err != nil || st != http.StatusOK {
		return fmt.Errorf("second request after restart: status %d: %v", st, err)
	}
	rebuiltPrefix := env.prefixDecisions() - prefix0 - stale
	o.check(rebuiltPrefix == 1, "the next request was not routed by the rebuilt index (%.0f prefix decisions)", rebuiltPrefix)
	_, err = waitFor(ctx, 5*time.Second, func() (bool, error) {
		for _, p := range env.sims {
			ok, _, _, err := env.agrees(ctx, p)
			if !ok || err != nil {
				return false, err
			}
		}
		return true, nil
	})
	o.check(err == nil, "index and engines disagree after the rebuild: %v", err)
	rebuilt := time.Since(tRestart)
	o.see("prefix routing back and index = /admin/blocks %d ms after the restart", rebuilt.Milliseconds())
	o.recovery, o.recoveryOf = cleared, "restart → index cleared"
	return nil
}

func runEventGap(ctx context.Context, env *world, o *outcome) error {
	// With replay.
	p := env.sims[0]
	resets, replays := env.seqEvents(p.Addr(), "reset"), env.seqEvents(p.Addr(), "replay")
	if err := env.post(ctx, p.URL()+"/admin/drop-events", `{"batches":3}`); err != nil {
		return err
	}
	tGap := time.Now()
	for i := 0; i < 6; i++ {
		if st, err := env.complete(ctx, promptOf(fmt.Sprintf("gap-a-%d", i), 60), 2, p.Addr()); err != nil || st != http.StatusOK {
			return fmt.Errorf("request to replica 0: status %d: %v", st, err)
		}
	}
	_, err := waitFor(ctx, 10*time.Second, func() (bool, error) {
		ok, _, _, err := env.agrees(ctx, p)
		return ok && env.seqEvents(p.Addr(), "replay") > replays, err
	})
	_, ix, tr, _ := env.agrees(ctx, p)
	o.see("replay: %.0f replays, %.0f resets, index %d = engine %d blocks", env.seqEvents(p.Addr(), "replay")-replays,
		env.seqEvents(p.Addr(), "reset")-resets, ix, tr)
	o.check(err == nil, "the gap was not replayed into agreement: %v", err)
	o.check(env.seqEvents(p.Addr(), "reset") == resets, "a gap replay could fill reset the replica")
	o.recovery, o.recoveryOf = time.Since(tGap), "gap → index = engine (replay)"

	// Without replay: reset, never guess.
	q := env.sims[1]
	for i := 0; i < 3; i++ {
		if st, err := env.complete(ctx, promptOf(fmt.Sprintf("gap-b-%d", i), 60), 2, q.Addr()); err != nil || st != http.StatusOK {
			return fmt.Errorf("request to replica 1: status %d: %v", st, err)
		}
	}
	if _, err := waitFor(ctx, 5*time.Second, func() (bool, error) { ok, _, _, err := env.agrees(ctx, q); return ok, err }); err != nil {
		return fmt.Errorf("replica 1 not in agreement before its gap: %w", err)
	}
	resetsQ := env.seqEvents(q.Addr(), "reset")
	if err := env.post(ctx, q.URL()+"/admin/drop-events", `{"batches":1}`); err != nil {
		return err
	}
	for i, tag := range []string{"gap-b-lost", "gap-b-reveal"} {
		if st, err := env.complete(ctx, promptOf(tag, 60), 2, q.Addr()); err != nil || st != http.StatusOK {
			return fmt.Errorf("request %d to replica 1: status %d: %v", i, st, err)
		}
	}
	if _, err := waitFor(ctx, 5*time.Second, func() (bool, error) { return env.seqEvents(q.Addr(), "reset") > resetsQ, nil }); err != nil {
		o.check(false, "no reset after a gap without replay: %v", err)
		return nil
	}
	_, ix, tr, err = env.agrees(ctx, q)
	if err != nil {
		return err
	}
	o.see("no replay: reset, index %d of engine's %d blocks (older entries dropped)", ix, tr)
	o.check(ix < tr, "after the reset the index still holds %d of %d blocks: entries from before the gap were kept", ix, tr)
	for i := 0; i < 2; i++ {
		if st, err := env.complete(ctx, promptOf(fmt.Sprintf("gap-b-after-%d", i), 60), 2, q.Addr()); err != nil || st != http.StatusOK {
			return fmt.Errorf("request to replica 1 after its reset: status %d: %v", st, err)
		}
	}
	_, err = waitFor(ctx, 5*time.Second, func() (bool, error) {
		n, err := env.indexBlocks(ctx, q.Addr())
		return n > ix, err
	})
	o.check(err == nil, "the index of replica 1 was not rebuilt from new events: %v", err)
	_, ix2, tr2, _ := env.agrees(ctx, q)
	o.check(ix2 <= tr2, "the index claims %d blocks, the engine holds %d", ix2, tr2)
	return nil
}

func runPublisherOutage(ctx context.Context, env *world, o *outcome) error {
	p := env.sims[0]
	resets, replays, reconnects := env.seqEvents(p.Addr(), "reset"), env.seqEvents(p.Addr(), "replay"), env.seqEvents(p.Addr(), "reconnect")
	const outage = 1500 * time.Millisecond
	if err := env.post(ctx, p.URL()+"/admin/kv-events-outage", fmt.Sprintf(`{"for":%q}`, outage.String())); err != nil {
		return err
	}
	tGone := time.Now()
	for i := 0; i < 3; i++ { // stored while the publisher is gone
		if st, err := env.complete(ctx, promptOf(fmt.Sprintf("outage-%d", i), 60), 2, p.Addr()); err != nil || st != http.StatusOK {
			return fmt.Errorf("request during the outage: status %d: %v", st, err)
		}
	}
	time.Sleep(time.Until(tGone.Add(outage)))
	i := 0
	back, err := waitFor(ctx, 15*time.Second, func() (bool, error) {
		i++ // new events reveal the gap once the subscriber is back
		if st, err := env.complete(ctx, promptOf(fmt.Sprintf("outage-back-%d", i), 60), 2, p.Addr()); err != nil || st != http.StatusOK {
			return false, fmt.Errorf("status %d: %v", st, err)
		}
		time.Sleep(100 * time.Millisecond)
		ok, _, _, err := env.agrees(ctx, p)
		return ok && env.seqEvents(p.Addr(), "replay") > replays, err
	})
	_, ix, tr, _ := env.agrees(ctx, p)
	o.see("%.0f reconnects, %.0f replays, %.0f resets; index %d = engine %d blocks %d ms after the publisher returned",
		env.seqEvents(p.Addr(), "reconnect")-reconnects, env.seqEvents(p.Addr(), "replay")-replays,
		env.seqEvents(p.Addr(), "reset")-resets, ix, tr, back.Milliseconds())
	o.check(err == nil, "index did not agree after the publisher returned: %v", err)
	o.check(env.seqEvents(p.Addr(), "reconnect") > reconnects, "the subscriber never lost its connection")
	o.check(env.seqEvents(p.Addr(), "reset") == resets, "the replica was reset although replay could fill the gap")
	o.check(back <= 6*time.Second, "agreement took %v (bound: max_backoff 5s + 1s)", back)
	o.recovery, o.recoveryOf = back, "publisher back → index = engine"
	return nil
}

func runMetricsHang(ctx context.Context, env *world, o *outcome, openBound time.Duration) error {
	p := env.sims[0]
	pr := env.startProber(ctx, "hang-probe", 50*time.Millisecond, 2, nil)
	defer pr.stop()
	time.Sleep(300 * time.Millisecond)
	if err := env.post(ctx, p.URL()+"/admin/faults", `{"metrics_hang":true}`); err != nil {
		return err
	}
	opened, err := waitFor(ctx, 5*time.Second, func() (bool, error) { return env.breaker(p.Addr()) == scheduler.BreakerOpen, nil })
	o.check(err == nil && opened <= openBound, "breaker open after %v (bound %v): %v", opened, openBound, err)
	staleAfter, err := waitFor(ctx, 5*time.Second, func() (bool, error) { return env.stale(p.Addr()), nil })
	o.check(err == nil, "the replica never turned stale: %v", err)
	o.see("breaker open after %d ms, stale after %d ms", opened.Milliseconds(), staleAfter.Milliseconds())
	time.Sleep(time.Second)
	if err := env.post(ctx, p.URL()+"/admin/faults", `{}`); err != nil {
		return err
	}
	back, err := waitFor(ctx, cooldown+8*time.Second, func() (bool, error) {
		return !env.stale(p.Addr()) && env.breaker(p.Addr()) == scheduler.BreakerClosed, nil
	})
	o.check(err == nil && back <= cooldown+2*time.Second, "fresh and closed %v after the fix (bound cooldown + 2s): %v", back, err)
	ps := pr.stop()
	failed, total := failures(ps, time.Time{})
	o.see("%d of %d requests failed; fresh and closed %d ms after the fix", failed, total, back.Milliseconds())
	o.check(total > 0 && failed == 0, "%d of %d requests failed while one replica's metrics hung", failed, total)
	o.recovery, o.recoveryOf = back, "fix → fresh and closed"
	return nil
}

func runAllStale(ctx context.Context, env *world, o *outcome) error {
	pr := env.startProber(ctx, "stale-probe", 50*time.Millisecond, 2, nil)
	defer pr.stop()
	time.Sleep(300 * time.Millisecond)
	for _, p := range env.sims {
		if err := env.post(ctx, p.URL()+"/admin/faults", `{"metrics_hang":true}`); err != nil {
			return err
		}
	}
	allBad := func() (bool, error) {
		for _, p := range env.sims {
			if !env.stale(p.Addr()) || env.breaker(p.Addr()) == scheduler.BreakerClosed {
				return false, nil
			}
		}
		return true, nil
	}
	took, err := waitFor(ctx, 5*time.Second, allBad)
	if err != nil {
		o.check(false, "replicas did not all turn stale with open breakers: %v", err)
		return nil
	}
	tAll := time.Now()
	// Breakers move on (after the cooldown a served probe closes one, the
	// next failed scrape reopens it); staleness is what must persist.
	allStale := func() bool {
		for _, p := range env.sims {
			if !env.stale(p.Addr()) {
				return false
			}
		}
		return true
	}
	stayed := true
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		stayed = stayed && allStale()
	}
	o.check(stayed, "not every replica stayed stale for the whole window")
	failedDuring, totalDuring := failures(pr.snapshot(), tAll)
	o.see("all stale and open after %d ms; %d of %d requests in the next 2 s failed", took.Milliseconds(), failedDuring, totalDuring)
	o.check(totalDuring > 0 && failedDuring == 0, "%d of %d requests failed while every replica was stale", failedDuring, totalDuring)
	for _, p := range env.sims {
		if err := env.post(ctx, p.URL()+"/admin/faults", `{}`); err != nil {
			return err
		}
	}
	back, err := waitFor(ctx, cooldown+10*time.Second, func() (bool, error) {
		for _, p := range env.sims {
			if env.stale(p.Addr()) || env.breaker(p.Addr()) != scheduler.BreakerClosed {
				return false, nil
			}
		}
		return true, nil
	})
	o.check(err == nil, "the pool did not come back fresh and closed: %v", err)
	ps := pr.stop()
	failed, total := failures(ps, time.Time{})
	o.see("all fresh and closed %d ms after the fix; %d of %d requests failed overall", back.Milliseconds(), failed, total)
	o.check(failed == 0, "%d requests failed", failed)
	o.recovery, o.recoveryOf = back, "fix → all fresh and closed"
	return nil
}
