package load

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"
)

// soak holds SoakRate for Soak, sampling the EPP's memory.
func (l *loader) soak(ctx context.Context) (*SoakResult, error) {
	o := l.o
	res := &SoakResult{Warmup: o.SoakWarmup.Seconds(), MaxGrowth: float64(o.SoakMaxGrowth), ErrorBudget: o.BudgetErrors}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	var sampleErr error
	sampled := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(sampled)
		tick := time.NewTicker(o.SoakSample)
		defer tick.Stop()
		prev, _ := l.clocks()
		for {
			heap, rss, err := memory(sctx, l.epp)
			if err != nil {
				if sctx.Err() == nil {
					sampleErr = err
				}
				return
			}
			ms := MemSample{At: time.Since(start).Seconds(), Heap: heap, RSS: rss, InFlight: l.inflight.Load()}
			if c, err := l.clocks(); err == nil {
				if wall := c.at.Sub(prev.at).Seconds(); wall > 0 {
					ms.EPPCores, ms.HostCores = (c.epp-prev.epp).Seconds()/wall, (c.host-prev.host).Seconds()/wall
				}
				prev = c
			}
			res.Samples = append(res.Samples, ms)
			if len(res.Samples)%max(1, int(time.Minute/o.SoakSample)) == 0 {
				l.progress("soak %5.0fs: heap in use %.1f MiB, RSS %.1f MiB\n", ms.At, heap/(1<<20), rss/(1<<20))
			}
			if ms.InFlight > int64(o.MaxInFlight)/4 {
				l.progress("soak %5.0fs: %d requests in flight, EPP %.2f cores, host %.2f busy cores, heap in use %.1f MiB\n",
					ms.At, ms.InFlight, ms.EPPCores, ms.HostCores, heap/(1<<20))
			}
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	st, err := l.step(ctx, o.SoakRate, 0, o.Soak)
	// One last sample at the end of the load.
	if heap, rss, merr := memory(ctx, l.epp); merr == nil {
		stop()
		<-sampled
		res.Samples = append(res.Samples, MemSample{At: time.Since(start).Seconds(), Heap: heap, RSS: rss})
	} else {
		stop()
		<-sampled
	}
	if err != nil {
		return res, err
	}
	if sampleErr != nil {
		return res, sampleErr
	}
	res.Load = st
	if err := res.judge(); err != nil {
		return res, err
	}
	return res, nil
}

// judge fits the memory samples after the warm-up and gives the verdict.
func (res *SoakResult) judge() error {
	var after []MemSample
	for _, s := range res.Samples {
		if s.At >= res.Warmup {
			after = append(after, s)
		}
	}
	if len(after) < 3 {
		return fmt.Errorf("soak: %d memory samples after the warm-up, need 3 (sample more often or soak longer)", len(after))
	}
	res.Heap = memTrend(after, func(s MemSample) float64 { return s.Heap })
	res.RSS = memTrend(after, func(s MemSample) float64 { return s.RSS })
	var why []string
	if res.Heap.FloorGrowth > res.MaxGrowth {
		why = append(why, fmt.Sprintf("heap floor grew %.1f MiB (fit) after the warm-up, limit %.1f MiB", res.Heap.FloorGrowth/(1<<20), res.MaxGrowth/(1<<20)))
	}
	if res.RSS.FloorGrowth > res.MaxGrowth {
		why = append(why, fmt.Sprintf("RSS floor grew %.1f MiB (fit) after the warm-up, limit %.1f MiB", res.RSS.FloorGrowth/(1<<20), res.MaxGrowth/(1<<20)))
	}
	res.MemoryPass = len(why) == 0
	// Latency is the ladder's business; a soak fails on memory, and on
	// errors or drops over the error budget.
	l := res.Load
	if total := l.OK + l.Errors + l.Dropped; total == 0 || float64(l.Errors+l.Dropped) > res.ErrorBudget*float64(total) {
		why = append(why, fmt.Sprintf("load: %d errors and %d dropped of %d requests", l.Errors, l.Dropped, total))
	}
	res.Pass = len(why) == 0
	res.Why = strings.Join(why, "; ")
	return nil
}

// memTrend fits a least-squares line to one series.
func memTrend(ss []MemSample, v func(MemSample) float64) MemTrend {
	t := MemTrend{First: v(ss[0]), Last: v(ss[len(ss)-1])}
	xs := make([]float64, len(ss))
	ys := make([]float64, len(ss))
	for i, s := range ss {
		xs[i], ys[i] = s.At, v(s)
		t.Max = math.Max(t.Max, ys[i])
	}
	span := xs[len(xs)-1] - xs[0]
	slope := linearSlope(xs, ys)
	t.SlopePerMin = slope * 60
	t.Growth = slope * span
	// The floor: the lowest sample of each tenth (at least 3 samples,
	// keeping at least 3 points to fit), at its own time.
	per := max(1, min(len(ss)/3, max(3, len(ss)/10)))
	k := len(ss) / per // windows of per to per+k-1 samples: no short last one
	var fx, fy []float64
	for w := 0; w < k; w++ {
		lo := w * len(ss) / k
		for j := lo; j < (w+1)*len(ss)/k; j++ {
			if ys[j] < ys[lo] {
				lo = j
			}
		}
		fx, fy = append(fx, xs[lo]), append(fy, ys[lo])
	}
	t.FloorGrowth = linearSlope(fx, fy) * span
	return t
}

// linearSlope is the least-squares slope of ys over xs (0 when undefined).
func linearSlope(xs, ys []float64) float64 {
	n := float64(len(xs))
	var sx, sy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
	}
	mx, my := sx/n, sy/n
	var num, den float64
	for i := range xs {
		num += (xs[i] - mx) * (ys[i] - my)
		den += (xs[i] - mx) * (xs[i] - mx)
	}
	if den == 0 {
		return 0
	}
	return num / den
}
