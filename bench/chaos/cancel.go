package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnious/provider-node/engines/openai"
	"github.com/omnious/provider-node/extproc/testgw"
)

// ending is where a client gives up on a request.
type ending int

const (
	endNormal      ending = iota
	endBeforeRoute        // the body never ends: the EPP has not routed yet
	endAtHeaders          // gone as the response headers arrive
	endMidBody            // gone after the first streamed chunk
)

// cancelGroups is how many prompt groups the cancel scenarios spread their
// requests over; each shares a prefix, so routing has affinity to keep.
const cancelGroups = 48

// cancelWorkload is one run of the cancel scenarios: requests from the
// prompt groups, ended as ends says. Both runs of a scenario use the same
// groups: the baseline places each group on a replica, and the run under
// test must keep it there (an opened breaker or a lost affinity moves the
// replicas' shares); the questions differ (from is where this run's count).
type cancelWorkload struct {
	base    string // gateway URL
	from    int
	ends    []ending
	workers int
}

// run sends the workload and returns how many normal requests failed.
func (w cancelWorkload) run(ctx context.Context, env *world) (failed int, err error) {
	var next, bad atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Pointer[error]
	for range w.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(w.ends) || ctx.Err() != nil {
					return
				}
				group := fmt.Sprintf("group-%d", i%cancelGroups)
				prompt := promptOf(group, 60) + fmt.Sprintf(" question %d", w.from+i)
				if err := env.request(ctx, w.base, prompt, group, 16, w.ends[i]); err != nil && w.ends[i] == endNormal {
					bad.Add(1)
					firstErr.CompareAndSwap(nil, &err)
				}
			}
		}()
	}
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		env.log.Sugar().Infof("first failed request through %s: %v", w.base, *e)
	}
	return int(bad.Load()), ctx.Err()
}

// request sends one streamed completion, tagged tag, through the gateway
// at base and ends it as end says; only a normal request reports a
// failure.
func (env *world) request(ctx context.Context, base, prompt, tag string, maxTokens int, end ending) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	b := completion(prompt, maxTokens, true)
	var body io.Reader = bytes.NewReader(b)
	if end == endBeforeRoute {
		pr, pw := io.Pipe()
		go func() {
			_, _ = pw.Write(b[:len(b)/2])
			time.Sleep(5 * time.Millisecond)
			cancel()
			_ = pw.CloseWithError(context.Canceled)
		}()
		body = pr
	}
	resp, err := env.sendTo(ctx, base, body, "", tag)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if end == endAtHeaders {
		return nil
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	for ev, err := range openai.Events(resp.Body, openai.DefaultMaxLine) {
		if err != nil {
			return err
		}
		if end == endMidBody || ev.Done {
			return nil
		}
	}
	return errors.New("stream ended without [DONE]")
}

// cancelMix is n requests of which cancelled are ended early, spread evenly
// over the three cancel points, in a seeded random order.
func cancelMix(n, cancelled int) []ending {
	ends := make([]ending, n)
	for i := range cancelled {
		ends[i] = endBeforeRoute + ending(i%3)
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	rnd.Shuffle(len(ends), func(i, j int) { ends[i], ends[j] = ends[j], ends[i] })
	return ends
}

// breakerWatch samples every replica's breaker until stopped and counts
// the samples that were not closed.
type breakerWatch struct {
	stop   context.CancelFunc
	done   chan struct{}
	opened atomic.Int64
}

func (env *world) watchBreakers(ctx context.Context) *breakerWatch {
	ctx, stop := context.WithCancel(ctx)
	bw := &breakerWatch{stop: stop, done: make(chan struct{})}
	go func() {
		defer close(bw.done)
		tick := time.NewTicker(scrapeInterval / 2)
		defer tick.Stop()
		for {
			for _, p := range env.sims {
				if env.breaker(p.Addr()) != 0 {
					bw.opened.Add(1)
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return bw
}

func (bw *breakerWatch) end() int {
	bw.stop()
	<-bw.done
	return int(bw.opened.Load())
}

// shares turns served counts into each replica's share, in points.
func (env *world) shares(counts map[string]int) map[string]float64 {
	total := 0
	for _, n := range counts {
		total += n
	}
	out := map[string]float64{}
	for _, p := range env.sims {
		if total > 0 {
			out[p.Addr()] = 100 * float64(counts[p.Addr()]) / float64(total)
		}
	}
	return out
}

// kept is the share of got's tagged requests served on their tag's home in
// base (the endpoint that served most of the tag's requests there), over
// the tags base served, and how many tags that is.
func kept(base, got served) (share float64, tags int) {
	var on, all int
	for tag, by := range got.tag {
		home, most := "", 0
		for addr, n := range base.tag[tag] {
			if n > most || (n == most && addr < home) {
				home, most = addr, n
			}
		}
		if most == 0 {
			continue
		}
		tags++
		for addr, n := range by {
			all += n
			if addr == home {
				on += n
			}
		}
	}
	if all == 0 {
		return 0, tags
	}
	return float64(on) / float64(all), tags
}

// maxShift is the largest difference between two share maps, in points.
func maxShift(a, b map[string]float64) float64 {
	var d float64
	for k, v := range a {
		d = math.Max(d, math.Abs(v-b[k]))
	}
	return d
}

func fmtShares(s map[string]float64) string {
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%.1f", s[k])
	}
	return strings.Join(parts, "/") + "%"
}

// settled waits until nothing is in flight at the EPP: its scheduler's
// counts (the capacity snapshot) and the ext_proc running gauge.
func (env *world) settled(ctx context.Context) (time.Duration, error) {
	return waitFor(ctx, 5*time.Second, func() (bool, error) {
		c, err := env.epp.Capacity(ctx)
		if err != nil {
			return false, err
		}
		inflight := 0
		for _, m := range c.Models {
			inflight += m.InFlight
		}
		running, _ := env.metric("inference_objective_running_requests", nil)
		return inflight == 0 && running == 0, nil
	})
}

// cancelBaseline runs the workload without cancels and returns what served
// it.
func cancelBaseline(ctx context.Context, env *world, o *outcome, n int) (served, error) {
	env.takeServed()
	failed, err := cancelWorkload{base: env.gw.URL(), ends: make([]ending, n), workers: 8}.run(ctx, env)
	if err != nil {
		return served{}, err
	}
	o.check(failed == 0, "%d of %d baseline requests failed", failed, n)
	return env.takeServed(), nil
}

// maxShareShift is how far, in points, a replica's share of the served
// requests may move from the run without cancels. Counting a cancel as
// evidence shows first as breakers opened and failures counted, which
// checkUnharmed requires to be none; without either, a few prompt groups
// still move with the load the cancelled requests put on their replicas
// until they abort (bench/README.md, Chaos). The line sits above those
// moves and below a third of one replica's share, what it loses when shut
// out for a third of the run (TestChaosScenarios/client-cancel).
const maxShareShift = 12

// checkUnharmed is what both cancel scenarios expect after their run: no
// breaker opened, no request counted as a failure, shares where the
// baseline had them, nothing left in flight. It also reports how many of
// the run's requests its prompt groups' baseline replicas served: a share
// that moved is prompt groups that moved, and this says by how much.
func checkUnharmed(ctx context.Context, env *world, o *outcome, opened int, baseServed, gotServed served) error {
	failures, _ := env.metric("omnious_epp_request_outcomes_total", map[string]string{"outcome": "failure"})
	unknown, _ := env.metric("omnious_epp_request_outcomes_total", map[string]string{"outcome": "unknown"})
	base, got := env.shares(baseServed.addr), env.shares(gotServed.addr)
	shift := maxShift(base, got)
	stayed, groups := kept(baseServed, gotServed)
	self, _ := kept(baseServed, baseServed)
	o.see("breaker samples not closed: %d; request outcomes failure %.0f, unknown %.0f; shares %s (baseline %s, largest shift %.1f points); "+
		"%.3f served on their group's baseline replica over %d groups (baseline %.3f)",
		opened, failures, unknown, fmtShares(got), fmtShares(base), shift, stayed, groups, self)
	o.check(opened == 0, "a breaker left closed %d times", opened)
	o.check(failures == 0, "%.0f requests counted as failures", failures)
	o.check(shift <= maxShareShift, "shares moved %.1f points from the baseline", shift)
	took, err := env.settled(ctx)
	if err != nil {
		o.check(false, "in flight not back to 0 within 5 s: %v", err)
		return nil
	}
	o.see("in flight back to 0 %v after the last request", took.Round(time.Millisecond))
	o.recovery, o.recoveryOf = took, "last request → nothing in flight"
	return nil
}

func runClientCancel(ctx context.Context, env *world, o *outcome) error {
	const normal, cancelled = 300, 1000
	base, err := cancelBaseline(ctx, env, o, normal)
	if err != nil {
		return err
	}
	bw := env.watchBreakers(ctx)
	failed, err := cancelWorkload{base: env.gw.URL(), from: normal, ends: cancelMix(normal+cancelled, cancelled), workers: 8}.run(ctx, env)
	opened := bw.end()
	if err != nil {
		return err
	}
	o.see("%d requests cancelled (before routing, at response headers, mid-body), %d normal: %d failed", cancelled, normal, failed)
	o.check(failed == 0, "%d normal requests failed", failed)
	return checkUnharmed(ctx, env, o, opened, base, env.takeServed())
}

func runNoResponsePhase(ctx context.Context, env *world, o *outcome) error {
	const n = 300
	base, err := cancelBaseline(ctx, env, o, n)
	if err != nil {
		return err
	}
	skip, err := env.startGateway(testgw.Config{EPP: env.epp.GRPCAddr(), SkipResponse: true})
	if err != nil {
		return err
	}
	defer skip.Close()
	bw := env.watchBreakers(ctx)
	failed, err := cancelWorkload{base: skip.URL(), from: n, ends: make([]ending, n), workers: 8}.run(ctx, env)
	opened := bw.end()
	if err != nil {
		return err
	}
	o.see("%d requests through a gateway without response processing: %d failed", n, failed)
	o.check(failed == 0, "%d requests failed", failed)
	return checkUnharmed(ctx, env, o, opened, base, env.takeServed())
}
