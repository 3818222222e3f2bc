package load

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnious/provider-node/bench/internal/launch"
	"github.com/omnious/provider-node/bench/internal/promtext"
	"github.com/omnious/provider-node/bench/internal/stat"
	"github.com/omnious/provider-node/extproc/testgw"
	"github.com/omnious/provider-node/internal/cputime"
)

// window collects one measured interval's observations.
type window struct {
	mu          sync.Mutex
	added, reqs []time.Duration
	e2e         []time.Duration
	ok, errs    int
}

type loader struct {
	o        Options
	w        *workload
	epp      *launch.EPP
	url      string
	http     *http.Client // with HTTP
	gw       http.Handler // without
	cur      atomic.Pointer[window]
	inflight atomic.Int64
	okTotal  atomic.Int64
}

func (l *loader) progress(format string, args ...any) {
	if l.o.Progress != nil {
		fmt.Fprintf(l.o.Progress, format, args...)
	}
}

// onExchange receives the gateway's view of every request.
func (l *loader) onExchange(t testgw.Timing) {
	w := l.cur.Load()
	if w == nil || t.Status != http.StatusOK || t.Err != nil {
		return
	}
	w.mu.Lock()
	w.added = append(w.added, t.Request+t.Response)
	w.reqs = append(w.reqs, t.Request)
	w.mu.Unlock()
}

// warmIndex publishes each group's system prompt from the stub the group
// belongs to (group g on stub g mod replicas) and waits until the EPP's
// index holds them. ZMQ drops what is published before the EPP's
// subscription is live, so it publishes again until the blocks show up.
func (l *loader) warmIndex(ctx context.Context, stubs []*stub) (int, error) {
	const blockSize = 16
	want := map[string]int{}
	for g, toks := range l.w.system {
		want[stubs[g%len(stubs)].Addr()] += len(toks) / blockSize
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		for g, toks := range l.w.system {
			if err := stubs[g%len(stubs)].publishBlocks(toks, blockSize, uint64(g)); err != nil {
				return 0, err
			}
		}
		time.Sleep(300 * time.Millisecond)
		got, err := l.epp.ResidentBlocks(ctx)
		if err != nil {
			return 0, err
		}
		total, ready := 0, true
		for addr, n := range want {
			total += got[addr]
			ready = ready && got[addr] >= n
		}
		if ready {
			return total, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("the EPP's index holds %v blocks per stub after 20s, want %v", got, want)
		}
	}
}

// drive offers rate requests per second, open loop, until dur passed.
func (l *loader) drive(ctx context.Context, rate float64, dur time.Duration, dropped *atomic.Int64, wg *sync.WaitGroup) {
	start := time.Now()
	sent := 0
	for ctx.Err() == nil {
		el := time.Since(start)
		if el >= dur {
			return
		}
		due := int(el.Seconds()*rate) + 1
		for ; sent < due; sent++ {
			if l.inflight.Load() >= int64(l.o.MaxInFlight) {
				dropped.Add(1)
				continue
			}
			l.inflight.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer l.inflight.Add(-1)
				l.one(ctx)
			}()
		}
		time.Sleep(time.Millisecond)
	}
}

func (l *loader) one(ctx context.Context) {
	start := time.Now()
	ok := l.send(ctx)
	took := time.Since(start)
	if ok {
		l.okTotal.Add(1)
	}
	w := l.cur.Load()
	if w == nil {
		return
	}
	w.mu.Lock()
	if ok {
		w.ok++
		w.e2e = append(w.e2e, took)
	} else {
		w.errs++
	}
	w.mu.Unlock()
}

// send sends one request and reads its whole answer; ok is a 200 read
// whole.
func (l *loader) send(ctx context.Context) (ok bool) {
	if l.http == nil { // no HTTP client's Timeout in process: bound it here
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.o.Timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.url, bytes.NewReader(l.w.body()))
	if err != nil {
		return false
	}
	req.Header["Content-Type"] = []string{"application/json"}
	if l.http == nil {
		return serveInProcess(l.gw, req) == http.StatusOK
	}
	resp, err := l.http.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return err == nil && resp.StatusCode == http.StatusOK
}

// reading is a snapshot of the CPU clocks a step reads.
type reading struct {
	at              time.Time
	epp, self, host time.Duration
	route           []promtext.Bucket // the EPP's route-duration histogram (stepClocks only)
	lag             []promtext.Bucket // the EPP's KV-event apply-lag histogram (stepClocks only)
}

func (l *loader) clocks() (reading, error) {
	c := reading{at: time.Now(), self: cputime.Clock()}
	var err1, err2 error
	c.epp, err1 = l.epp.CPU()
	c.host, err2 = hostBusy()
	return c, errors.Join(err1, err2)
}

// stepClocks is clocks plus the EPP's route histogram, which a step's
// quantiles of the EPP's own latency need (the floor server has none).
func (l *loader) stepClocks(ctx context.Context) (reading, error) {
	c, err := l.clocks()
	if err == nil && !l.o.Floor {
		var page *bytes.Reader
		if page, err = l.epp.Metrics(ctx); err != nil {
			return c, err
		}
		if c.route, err = promtext.Buckets(page, routeMetric); err != nil {
			return c, err
		}
		_, _ = page.Seek(0, io.SeekStart)
		c.lag, err = promtext.Buckets(page, lagMetric)
	}
	return c, err
}

// idle is the EPP's cores over d with no traffic.
func (l *loader) idle(ctx context.Context, d time.Duration) (float64, error) {
	c0, err := l.clocks()
	if err != nil {
		return 0, err
	}
	if err := sleepCtx(ctx, d); err != nil {
		return 0, err
	}
	c1, err := l.clocks()
	if err != nil {
		return 0, err
	}
	return (c1.epp - c0.epp).Seconds() / c1.at.Sub(c0.at).Seconds(), nil
}

// step offers rate for warmup (not measured) then measure, and summarises
// the measured interval.
func (l *loader) step(ctx context.Context, rate float64, warmup, measure time.Duration) (Step, error) {
	var dropped atomic.Int64
	var wg sync.WaitGroup
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.drive(ctx, rate, warmup+measure, &dropped, &wg)
	}()
	if err := sleepCtx(ctx, warmup); err != nil {
		<-done
		wg.Wait()
		return Step{}, err
	}
	w := &window{}
	c0, err := l.stepClocks(ctx)
	if err != nil {
		<-done
		wg.Wait()
		return Step{}, err
	}
	d0 := dropped.Load()
	l.cur.Store(w)
	<-done
	l.cur.Store(nil)
	c1, err := l.stepClocks(ctx)
	d1 := dropped.Load()
	wg.Wait()
	if err != nil {
		return Step{}, err
	}
	if err := ctx.Err(); err != nil {
		return Step{}, err
	}
	return l.summarise(rate, w, c0, c1, int(d1-d0)), nil
}

func (l *loader) summarise(rate float64, w *window, c0, c1 reading, dropped int) Step {
	w.mu.Lock()
	defer w.mu.Unlock()
	wall := c1.at.Sub(c0.at).Seconds()
	st := Step{Rate: rate, Seconds: wall, OK: w.ok, Errors: w.errs, Dropped: dropped}
	st.Decisions = float64(w.ok) / wall
	eppCPU := (c1.epp - c0.epp).Seconds()
	st.EPPCores = eppCPU / wall
	if eppCPU > 0 {
		st.PerEPPCore = float64(w.ok) / eppCPU
	}
	st.BenchCores = (c1.self - c0.self).Seconds() / wall
	st.HostCores = (c1.host - c0.host).Seconds() / wall
	added := stat.SortedMillis(w.added, 1)
	st.AddedP50, st.AddedP99 = stat.Percentile(added, 50), stat.Percentile(added, 99)
	st.RequestP99 = stat.Percentile(stat.SortedMillis(w.reqs, 1), 99)
	if p50 := promtext.Quantile(0.5, c0.route, c1.route); !math.IsNaN(p50) {
		st.RouteP50, st.RouteP99 = 1000*p50, 1000*promtext.Quantile(0.99, c0.route, c1.route)
	}
	if p99 := promtext.Quantile(0.99, c0.lag, c1.lag); !math.IsNaN(p99) {
		st.ApplyLagP99 = 1000 * p99
	}
	if st.Decisions > 0 {
		st.CoresPerReq = st.EPPCores / st.Decisions
	}
	e2e := stat.SortedMillis(w.e2e, 1)
	st.E2EP50, st.E2EP99 = stat.Percentile(e2e, 50), stat.Percentile(e2e, 99)
	var why []string
	total := w.ok + w.errs + dropped
	switch {
	case w.ok == 0:
		why = append(why, "no request succeeded")
	case float64(w.errs+dropped) > l.o.BudgetErrors*float64(total):
		why = append(why, fmt.Sprintf("errors %d + dropped %d of %d over %.2g%%", w.errs, dropped, total, 100*l.o.BudgetErrors))
	}
	if st.Decisions < 0.95*rate {
		why = append(why, fmt.Sprintf("delivered %.0f/s of %.0f/s offered", st.Decisions, rate))
	}
	if !(st.AddedP99 <= ms(l.o.BudgetP99)) {
		why = append(why, fmt.Sprintf("p99 added %.3f ms over %.3f ms", st.AddedP99, ms(l.o.BudgetP99)))
	}
	st.Pass = len(why) == 0
	st.Why = strings.Join(why, "; ")
	return st
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
