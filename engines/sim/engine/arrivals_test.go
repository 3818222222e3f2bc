package engine

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// arrivalsPoint is one engine's inter-token latencies under one arrival
// process, in model time: the mean load (running plus waiting), the share
// of inter-token latencies within 50 ms, the share of the time a request
// waited, and the share within 50 ms of the 250 ms windows at each load,
// as the EPP's capacity curves bin their scrapes.
type arrivalsPoint struct {
	load, within, queued float64
	windows              map[int][2]float64 // load -> within, count
}

func (p arrivalsPoint) windowWithin(load int) float64 {
	w := p.windows[load]
	if w[1] == 0 {
		return 0
	}
	return w[0] / w[1]
}

// runArrivals drives the default engine with 60 shared 10,500-token
// prefixes, each request one of them plus a new suffix (exponential, mean
// 3,000 tokens) for 1 to 300 output tokens: from streams clients each
// sending its next request as its last ends, or, when streams is 0, from
// Poisson arrivals at rate a second. The first fifth of d is not measured.
func runArrivals(tb testing.TB, streams int, rate float64, d time.Duration) arrivalsPoint {
	h := newHarness(tb, Config{NumGPUBlocks: 140800})
	rng := rand.New(rand.NewPCG(1, 2))
	prefixes := make([][]uint32, 60)
	for i := range prefixes {
		prefixes[i] = make([]uint32, 10_500)
		for j := range prefixes[i] {
			prefixes[i][j] = rng.Uint32N(150_000)
		}
	}
	type client struct {
		ch      <-chan Update
		lastGen int
		last    time.Duration
	}
	var clients []*client
	submit := func() {
		p := append([]uint32(nil), prefixes[rng.IntN(len(prefixes))]...)
		for range int(rng.ExpFloat64() * 3000) {
			p = append(p, rng.Uint32N(150_000))
		}
		clients = append(clients, &client{ch: h.submit("r", p, seq(1, 1+rng.IntN(300)))})
	}
	for range streams {
		submit()
	}
	next := func() time.Duration { return time.Duration(rng.ExpFloat64() / rate * float64(time.Second)) }
	var arrival time.Duration
	if streams == 0 {
		arrival = next()
	}
	const window = 250 * time.Millisecond
	warm := d / 5
	p := arrivalsPoint{windows: make(map[int][2]float64)}
	var loadSum, busy, queued, within, count float64
	var wLoad, wTime, wWithin, wCount float64
	wEnd := warm + window
	now := time.Duration(0)
	for now < d {
		for streams == 0 && arrival <= now {
			submit()
			arrival += next()
		}
		st := h.e.Snapshot()
		step := h.step()
		if step == 0 {
			if streams > 0 {
				tb.Fatal("engine idle with streams open")
			}
			// Idle: the next arrival is the next thing that happens.
			now = arrival
			h.clock.set(h.e.WallTime(now))
			continue
		}
		now = h.e.Snapshot().ModelTime
		measuring := now > warm
		if measuring {
			load := float64(st.Running + st.Waiting)
			loadSum += load * step.Seconds()
			busy += step.Seconds()
			if st.Waiting > 0 {
				queued += step.Seconds()
			}
			wLoad += load * step.Seconds()
			wTime += step.Seconds()
		}
		done := 0
		keep := clients[:0]
		for _, c := range clients {
			finished := false
		drain:
			for {
				select {
				case u, ok := <-c.ch:
					if !ok {
						finished = true
						break drain
					}
					if u.Generated > c.lastGen {
						if c.lastGen > 0 && measuring {
							n := float64(u.Generated - c.lastGen)
							count += n
							wCount += n
							if (now-c.last)/time.Duration(u.Generated-c.lastGen) <= 50*time.Millisecond {
								within += n
								wWithin += n
							}
						}
						c.lastGen, c.last = u.Generated, now
					}
					if u.Done {
						if u.Err != nil {
							tb.Fatalf("request failed: %v", u.Err)
						}
						finished = true
						break drain
					}
				default:
					break drain
				}
			}
			if finished {
				done++
			} else {
				keep = append(keep, c)
			}
		}
		clients = keep
		if streams > 0 {
			for range done {
				submit()
			}
		}
		if measuring && now >= wEnd {
			w := p.windows[int(wLoad/wTime)]
			p.windows[int(wLoad/wTime)] = [2]float64{w[0] + wWithin, w[1] + wCount}
			wLoad, wTime, wWithin, wCount = 0, 0, 0, 0
			wEnd = now + window
		}
	}
	p.load, p.queued = loadSum/busy, queued/busy
	if count > 0 {
		p.within = within / count
	}
	return p
}

// BenchmarkEngineArrivals compares one engine held at a load by a client's
// streams with the same engine under Poisson arrivals, on a mix of long
// shared prefixes (about 0.7 of a prompt cached):
//
//	go test ./engines/sim/engine -run '^$' -bench EngineArrivals -benchtime 1x -v
//
// It asks whether the way requests come changes what a load costs in
// inter-token latency, inside the engine alone: the capacity curves read
// a client's streams from windows binned by load that arrivals filled.
func BenchmarkEngineArrivals(b *testing.B) {
	for _, c := range []struct {
		streams int
		rate    float64
	}{{8, 0}, {11, 0}, {14, 0}, {0, 2.3}, {0, 2.6}} {
		name := fmt.Sprintf("streams=%d", c.streams)
		if c.streams == 0 {
			name = fmt.Sprintf("poisson=%.1f", c.rate)
		}
		b.Run(name, func(b *testing.B) {
			var p arrivalsPoint
			for range b.N {
				p = runArrivals(b, c.streams, c.rate, 900*time.Second)
			}
			b.ReportMetric(p.load, "load")
			b.ReportMetric(p.within, "itl_within_50ms")
			b.ReportMetric(p.queued, "queued_share")
			for _, k := range []int{8, 11, 14} {
				b.ReportMetric(p.windowWithin(k), fmt.Sprintf("windows_at_%d_itl_within_50ms", k))
			}
		})
	}
}
