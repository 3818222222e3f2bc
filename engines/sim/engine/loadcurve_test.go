package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// loadCurvePoint is the steady-state latency at one concurrency, in model time.
type loadCurvePoint struct {
	conc                             int
	ttftP50, ttftP90, itlP50, itlP90 time.Duration
	outputTokPerSec                  float64
}

// runLoadCurve drives the default engine of a flavour (Qwen3-32B on 2xH100 calibration)
// with conc closed-loop clients sending unique promptLen-token prompts for
// outLen tokens, entirely in model time with a fake clock. Each client's
// first request has a random output length so that clients desynchronise;
// the next measured requests per client are recorded.
func runLoadCurve(tb testing.TB, flavour string, conc, measured, promptLen, outLen int) loadCurvePoint {
	h := newHarness(tb, Config{Flavour: flavour})
	rng := rand.New(rand.NewPCG(uint64(conc), 7))
	type client struct {
		ch              <-chan Update
		submitted, last time.Duration
		lastGen, n      int
	}
	var ttfts, itls []time.Duration
	genTokens := 0
	var measureStart, measureEnd time.Duration
	submit := func(c *client, out int) {
		prompt := make([]uint32, promptLen)
		for i := range prompt {
			prompt[i] = rng.Uint32N(150_000)
		}
		c.ch = h.submit("r", prompt, seq(1, out))
		c.submitted = h.e.Snapshot().ModelTime
		c.lastGen = 0
	}
	clients := make([]*client, conc)
	for i := range clients {
		clients[i] = &client{}
		submit(clients[i], 1+rng.IntN(outLen))
	}
	finished := 0
	for finished < conc*measured {
		if h.step() == 0 {
			tb.Fatal("engine idle with clients waiting")
		}
		now := h.e.Snapshot().ModelTime
		for _, c := range clients {
			for drained := false; !drained; {
				select {
				case u, ok := <-c.ch:
					if !ok {
						drained = true
						break
					}
					measuring := c.n > 0
					if u.Generated > c.lastGen && measuring {
						if c.lastGen == 0 {
							ttfts = append(ttfts, now-c.submitted)
							if measureStart == 0 {
								measureStart = now
							}
						} else {
							per := (now - c.last) / time.Duration(u.Generated-c.lastGen)
							for range u.Generated - c.lastGen {
								itls = append(itls, per)
							}
						}
						genTokens += u.Generated - c.lastGen
					}
					if u.Generated > c.lastGen {
						c.lastGen, c.last = u.Generated, now
					}
					if u.Done {
						if u.Err != nil {
							tb.Fatalf("request failed: %v", u.Err)
						}
						if measuring {
							finished++
							measureEnd = now
						}
						c.n++
						submit(c, outLen)
						drained = true
					}
				default:
					drained = true
				}
			}
		}
	}
	p := loadCurvePoint{conc: conc,
		ttftP50: percentile(ttfts, 0.5), ttftP90: percentile(ttfts, 0.9),
		itlP50: percentile(itls, 0.5), itlP90: percentile(itls, 0.9)}
	if measureEnd > measureStart {
		p.outputTokPerSec = float64(genTokens) / (measureEnd - measureStart).Seconds()
	}
	return p
}

func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkEngineLoadCurve reports the simulated TTFT and ITL (model time)
// at 1, 8, 32 and 64 concurrent 2000-token-prompt, 256-token-output requests:
//
//	go test ./engines/sim/engine -run '^$' -bench EngineLoadCurve -benchtime 1x -v
func BenchmarkEngineLoadCurve(b *testing.B) {
	for _, flavour := range []string{FlavourVLLM, FlavourSGLang} {
		var rows []string
		for _, conc := range []int{1, 8, 32, 64} {
			b.Run(fmt.Sprintf("%s/conc=%d", flavour, conc), func(b *testing.B) {
				var p loadCurvePoint
				for range b.N {
					p = runLoadCurve(b, flavour, conc, 3, 2000, 256)
				}
				b.ReportMetric(ms(p.ttftP50), "ttft_p50_ms")
				b.ReportMetric(ms(p.ttftP90), "ttft_p90_ms")
				b.ReportMetric(ms(p.itlP50), "itl_p50_ms")
				b.ReportMetric(ms(p.itlP90), "itl_p90_ms")
				b.ReportMetric(p.outputTokPerSec, "out_tok/s")
				rows = append(rows, fmt.Sprintf("%5d %12.1f %12.1f %11.1f %11.1f %10.0f",
					conc, ms(p.ttftP50), ms(p.ttftP90), ms(p.itlP50), ms(p.itlP90), p.outputTokPerSec))
			})
		}
		b.Logf("%s\n conc  ttft_p50_ms  ttft_p90_ms  itl_p50_ms  itl_p90_ms  out_tok/s\n%s", flavour, joinLines(rows))
	}
}

// BenchmarkStep measures the simulator's own cost per step (real time, not
// model time) with 64 requests in flight, replaced as they finish.
func BenchmarkStep(b *testing.B) {
	h := newHarness(b, Config{})
	next := 0
	refill := func() {
		for st := h.e.Snapshot(); st.Running+st.Waiting < 64; st.Running++ {
			next++
			if _, err := h.e.Submit(context.Background(), &Request{ID: "r", Prompt: seq(next*10_000, 2000), Output: seq(1, 256)}); err != nil {
				b.Fatal(err)
			}
		}
	}
	refill()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		h.step()
		refill()
	}
}

func joinLines(rows []string) string {
	out := ""
	for _, r := range rows {
		out += r + "\n"
	}
	return out
}

// TestLoadCurveShape checks the calibration's shape (not exact figures):
// latency grows with load, and a lone request sees about 11 ms ITL.
func TestLoadCurveShape(t *testing.T) {
	lo := runLoadCurve(t, FlavourVLLM, 1, 2, 2000, 64)
	hi := runLoadCurve(t, FlavourVLLM, 32, 1, 2000, 64)
	require.InDelta(t, 11, ms(lo.itlP50), 1, "a lone request decodes at about 11 ms per token")
	require.Greater(t, hi.itlP50, lo.itlP50, "ITL grows with load")
	require.Greater(t, hi.ttftP50, lo.ttftP50, "TTFT grows with load")
	// A lone 2000-token prefill: PrefillBase + 2000 x PrefillPerToken.
	ti := plain(Config{}.WithDefaults().Timing)
	require.Equal(t, ti.PrefillBase+2000*ti.PrefillPerToken, lo.ttftP50)
}
