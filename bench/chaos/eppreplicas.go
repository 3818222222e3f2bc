package chaos

import (
	"context"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/omnious/provider-node/bench/internal/launch"
	"github.com/omnious/provider-node/bench/internal/promtext"
	"github.com/omnious/provider-node/extproc/testgw"
	"github.com/omnious/provider-node/scheduler"
)

// Two EPPs side by side serve one pool active-active: each subscribes to
// every replica's KV events and scrapes every replica itself, nothing is
// shared between them, and the gateway spreads streams over both (round
// robin over the healthy, as an Envoy ext_proc cluster).
const (
	replicaClients = 8               // streaming clients
	replicaTokens  = 20              // tokens per streamed response
	replicaWindow  = 2 * time.Second // prefix share window
	replicaWarm    = time.Second     // every prompt family stored somewhere
)

// replicaLoad is the side-by-side scenarios' load: streamed completions
// from six 300-word prompt families, so that most decisions are prefix
// decisions once the families are stored.
func replicaLoad() load {
	families := make([]string, 6)
	for i := range families {
		families[i] = promptOf(fmt.Sprintf("pair-family-%d", i), 300)
	}
	return load{every: 20 * time.Millisecond, workers: replicaClients, tokens: replicaTokens, stream: true,
		prompt: func(w, i int) string { return families[(w+i)%len(families)] + fmt.Sprintf(" ask %d %d", w, i) }}
}

// gatewayUnhealthy is how many failed health checks mark an EPP host down.
func gatewayUnhealthy() int { return testgw.Config{}.WithDefaults().HealthUnhealthy }

// decisionReasons are the precise policy's decision reasons.
var decisionReasons = []string{scheduler.ReasonPrefix, scheduler.ReasonSession, scheduler.ReasonOverride, scheduler.ReasonCold,
	scheduler.ReasonFallback}

// decisions is an EPP's count of decisions by reason, from one read of its
// /metrics (omnious_epp_decisions_total).
type decisions map[string]float64

func decisionsOf(ctx context.Context, e *launch.EPP) (decisions, error) {
	page, err := e.Metrics(ctx)
	if err != nil {
		return nil, err
	}
	d := decisions{}
	for _, r := range decisionReasons {
		if _, err := page.Seek(0, io.SeekStart); err != nil {
			return nil, err
		}
		if d[r], _, err = promtext.SumWhere(page, "omnious_epp_decisions_total", map[string]string{"reason": r}); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// since is the prefix share of the decisions made after prev, how many
// there were, and the count of each other reason.
func (d decisions) since(prev decisions) (share float64, n int, others string) {
	var all float64
	var parts []string
	for _, r := range decisionReasons {
		k := d[r] - prev[r]
		all += k
		if r != scheduler.ReasonPrefix && k > 0 {
			parts = append(parts, fmt.Sprintf("%.0f %s", k, r))
		}
	}
	if all <= 0 {
		return 0, 0, ""
	}
	return (d[scheduler.ReasonPrefix] - prev[scheduler.ReasonPrefix]) / all, int(all), strings.Join(parts, ", ")
}

// runEPPKillOneOfTwo SIGKILLs one of two EPP processes under streamed
// load. Only the streams open on it at that instant may fail: a new stream
// the gateway cannot open there goes to the survivor at once, and the
// health checks soon stop trying. The survivor routes as well as before:
// its index was never the victim's.
func runEPPKillOneOfTwo(ctx context.Context, env *world, o *outcome) error {
	victim, survivor := env.epps[0], env.epps[1]
	pr := env.startLoad(ctx, replicaLoad())
	defer pr.stop()
	time.Sleep(replicaWarm)
	d0, err := decisionsOf(ctx, survivor)
	if err != nil {
		return err
	}
	time.Sleep(replicaWindow)
	d1, err := decisionsOf(ctx, survivor)
	if err != nil {
		return err
	}

	// A SIGKILL is not instantaneous: until the process is gone its
	// sockets accept streams. The streams it may take down are those open
	// at the signal and those opened before it was gone; all have ended
	// once it holds none, and each ended exchange was counted.
	vaddr := victim.GRPCAddr()
	open := env.gw.OpenStreams()[vaddr]
	ex0, _ := env.exchangesOf(vaddr)
	tKill := time.Now()
	if err := victim.Kill(); err != nil {
		return err
	}
	tGone := time.Now()
	if _, err := waitFor(ctx, 10*time.Second, func() (bool, error) { return env.gw.OpenStreams()[vaddr] == 0, nil }); err != nil {
		o.check(false, "the killed EPP's streams did not end: %v", err)
		return nil
	}
	ex1, tEnded := env.exchangesOf(vaddr)
	atKill := ex1 - ex0 // open at the signal or opened until it was gone
	ended := max(tEnded.Sub(tKill), 0)
	time.Sleep(time.Until(tKill.Add(replicaWindow)))
	d2, err := decisionsOf(ctx, survivor)
	if err != nil {
		return err
	}
	// Before the load stops: its cancelled requests are not failures.
	xs := env.failedExchanges()
	ps := pr.stop()

	// Client side: every request, by when it was sent and ended.
	var failed, failedBefore int
	for _, p := range ps {
		if !p.ok() {
			failed++
			if p.end.Before(tKill) {
				failedBefore++
			}
		}
	}
	failedSentAfter, sentAfter := failures(ps, tGone)
	// The gateway's view: which host each failed exchange was on, and when
	// it ended.
	var onVictim, elsewhere, late int
	for _, x := range xs {
		if x.epp == victim.GRPCAddr() {
			onVictim++
		} else {
			elsewhere++
		}
		if x.at.After(tEnded) {
			late++
		}
	}
	before, nBefore, otherBefore := d1.since(d0)
	after, nAfter, otherAfter := d2.since(d1)
	shift := 100 * math.Abs(after-before)

	o.see("%d streams open on the killed EPP at the signal, %d more opened until it was gone %d ms later; its streams ended %d ms after the signal",
		open, atKill-open, tGone.Sub(tKill).Milliseconds(), ended.Milliseconds())
	o.see("%d of %d requests failed (%d exchanges on the killed EPP, %d elsewhere); %d of the %d sent after it was gone",
		failed, len(ps), onVictim, elsewhere, failedSentAfter, sentAfter)
	o.see("survivor's prefix share %.0f%% of %d decisions before%s, %.0f%% of %d after%s (%.1f points)",
		100*before, nBefore, paren(otherBefore), 100*after, nAfter, paren(otherAfter), shift)
	o.check(failedBefore == 0, "%d requests failed before the kill", failedBefore)
	o.check(failed <= atKill, "%d requests failed, more than the %d streams open on the killed EPP", failed, atKill)
	o.check(failedSentAfter == 0, "%d requests sent after the killed EPP was gone failed", failedSentAfter)
	o.check(elsewhere == 0, "%d exchanges failed on the surviving EPP", elsewhere)
	o.check(late == 0, "%d exchanges failed after the killed EPP's streams had ended", late)
	o.check(nBefore >= 10 && nAfter >= 10, "too few survivor decisions to compare (%d before, %d after)", nBefore, nAfter)
	o.check(shift <= 5, "the survivor's prefix share moved %.1f points", shift)
	o.check(nAfter > nBefore, "the survivor did not take the killed EPP's share (%d decisions before, %d after)", nBefore, nAfter)
	o.recovery, o.recoveryOf = ended, "kill → its streams ended"
	return nil
}

// runEPPRollout restarts both EPP processes one after the other, as a
// rolling update does: SIGTERM (health NOT_SERVING, drain), exit, start on
// the same ports, wait until ready, then the next. The gateway moves new
// streams to the other EPP while one is away, so no request may fail.
func runEPPRollout(ctx context.Context, env *world, o *outcome) error {
	pr := env.startLoad(ctx, replicaLoad())
	defer pr.stop()
	time.Sleep(replicaWarm)
	var slowest time.Duration
	var steps []string
	restarted := make([]int, len(env.epps)) // exchanges ended on each before its restart
	for i, e := range env.epps {
		tTerm := time.Now()
		if err := e.Stop(); err != nil {
			return fmt.Errorf("rolling EPP %d: %w", i, err)
		}
		exited := time.Since(tTerm)
		restarted[i], _ = env.exchangesOf(e.GRPCAddr())
		tStart := time.Now()
		if err := e.Start(); err != nil {
			return fmt.Errorf("rolling EPP %d: %w", i, err)
		}
		started := time.Since(tStart)
		waited, err := e.WaitReady(ctx, len(env.sims))
		if err != nil {
			return fmt.Errorf("rolling EPP %d: %w", i, err)
		}
		ready := started + waited // from its start, without WaitReady's settling pause
		slowest = max(slowest, ready)
		steps = append(steps, fmt.Sprintf("EPP %d exited %d ms after SIGTERM and was ready %d ms after its start",
			i, exited.Milliseconds(), ready.Milliseconds()))
	}
	time.Sleep(time.Second)     // both serve again
	xs := env.failedExchanges() // before the load stops: its cancelled requests are not failures
	ps := pr.stop()
	failed, total := failures(ps, time.Time{})
	var carried []string
	for i, e := range env.epps {
		n, _ := env.exchangesOf(e.GRPCAddr())
		carried = append(carried, strconv.Itoa(n-restarted[i]))
		// The gateway takes it back at its next passing health check.
		o.check(n > restarted[i], "EPP %d got no stream from the gateway after its restart", i)
	}
	o.see("%s", strings.Join(steps, "; "))
	o.see("streams carried after their restarts: %s; %d of %d requests failed", strings.Join(carried, " and "), failed, total)
	if len(xs) > 0 {
		o.see("first failed exchange: status %d on %s: %v", xs[0].status, xs[0].epp, xs[0].err)
	}
	o.check(total > 0 && failed == 0, "%d of %d requests failed during the rollout", failed, total)
	o.recovery, o.recoveryOf = slowest, "start → ready, the slower EPP"
	return nil
}

func paren(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}
