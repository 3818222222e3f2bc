package chaos

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// runEPPRestart stops the EPP under load and starts a new one on the same
// ports. The test gateway fails closed as Envoy does with
// failure_mode_allow: false (its default): while no EPP answers, requests
// get a 500 from the gateway. The new EPP starts with an empty index: it
// learns only blocks the engines store from then on, so precision returns
// as the workload's prefixes are stored again.
func runEPPRestart(ctx context.Context, env *world, o *outcome) error {
	// Six prompt families sharing 300-word prefixes: with a warm index
	// most decisions are prefix decisions.
	families := make([]string, 6)
	for i := range families {
		families[i] = promptOf(fmt.Sprintf("family-%d", i), 300)
	}
	prompt := func(w, i int) string { return families[(w+i)%len(families)] + fmt.Sprintf(" ask %d %d", w, i) }
	pr := env.startProber(ctx, "epp-load", 50*time.Millisecond, 3, prompt)
	defer pr.stop()

	time.Sleep(time.Second) // every family is stored somewhere
	p0, a0 := env.prefixDecisions(), env.allDecisions()
	time.Sleep(2 * time.Second)
	p1, a1 := env.prefixDecisions(), env.allDecisions()
	if a1-a0 < 10 {
		return fmt.Errorf("only %.0f decisions in 2s before the restart", a1-a0)
	}
	before := (p1 - p0) / (a1 - a0)

	tDown := time.Now()
	if err := env.epp.Stop(); err != nil {
		return err
	}
	drained := time.Since(tDown)
	time.Sleep(time.Second) // down
	tUp := time.Now()
	if err := env.epp.Start(); err != nil {
		return err
	}
	served, err := waitFor(ctx, 10*time.Second, func() (bool, error) {
		for _, p := range pr.snapshot() {
			if p.at.After(tUp) && p.ok() {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		o.check(false, "no request served after the EPP returned: %v", err)
		return nil
	}
	indexed, err := waitFor(ctx, 10*time.Second, func() (bool, error) {
		for _, p := range env.sims {
			if n, err := env.indexBlocks(ctx, p.Addr()); err != nil || n > 0 {
				return err == nil, err
			}
		}
		return false, nil
	})
	o.check(err == nil, "the new EPP's index stayed empty: %v", err)
	indexed = time.Since(tUp) // from the EPP's start, not from the wait's

	// Precision is back when the share of prefix decisions over a 1 s
	// window reaches 90% of what it was before the restart.
	var precise time.Duration
	prevP, prevA := env.prefixDecisions(), env.allDecisions()
	_, err = waitFor(ctx, 30*time.Second, func() (bool, error) {
		time.Sleep(time.Second)
		p, a := env.prefixDecisions(), env.allDecisions()
		ok := a-prevA >= 5 && (p-prevP)/(a-prevA) >= 0.9*before
		prevP, prevA = p, a
		return ok, nil
	})
	precise = time.Since(tUp)
	o.check(err == nil, "prefix routing did not return to 90%% of its earlier share (%.0f%%) within 30 s", 100*before)

	// Coverage: the share of the engines' blocks the new index knows.
	var ix, tr int
	for _, p := range env.sims {
		n, err := env.indexBlocks(ctx, p.Addr())
		if err != nil {
			return err
		}
		m, err := env.truthBlocks(ctx, p)
		if err != nil {
			return err
		}
		ix, tr = ix+n, tr+m
	}
	ps := pr.stop()
	var downFailed, down500, afterFailed, after, beforeFailed int
	for _, p := range ps {
		switch {
		case p.at.Before(tDown):
			if !p.ok() {
				beforeFailed++
			}
		case p.at.Before(tUp.Add(served)):
			if !p.ok() {
				downFailed++
				if p.err == nil && p.status == http.StatusInternalServerError {
					down500++
				}
			}
		default:
			after++
			if !p.ok() {
				afterFailed++
			}
		}
	}
	o.see("drained in %d ms; %d requests failed while down (%d with the gateway's 500: fail-closed)",
		drained.Milliseconds(), downFailed, down500)
	o.see("first request served %d ms after the EPP returned, index non-empty after %d ms, prefix share %.0f%% → back to ≥90%% of it after %.1f s; index covers %d of %d engine blocks",
		served.Milliseconds(), indexed.Milliseconds(), 100*before, precise.Seconds(), ix, tr)
	o.check(beforeFailed == 0, "%d requests failed before the restart", beforeFailed)
	o.check(downFailed == down500, "%d requests failed while the EPP was down with something other than the gateway's 500", downFailed-down500)
	o.check(served <= 5*time.Second, "first request served %v after the EPP returned (bound 5s)", served)
	o.check(after > 0 && afterFailed == 0, "%d of %d requests failed once the EPP served again", afterFailed, after)
	o.recovery, o.recoveryOf = precise, "EPP start → prefix share back"
	return nil
}
