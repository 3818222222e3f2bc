package scheduler

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/engines/metrics"
	"github.com/omnious/provider-node/engines/sim/engine"
)

// updateSeries re-records the ladder expositions from the engine simulator:
//
//	go test ./scheduler/ -run TestRecordedSeries -update
var updateSeries = flag.Bool("update", false, "re-record ../capacity/testdata/*-ladder.txt.gz from the engine simulator")

// A recorded ladder: closed-loop clients at each level for hold of model
// time, unique prompt-token prompts for output tokens, the engine's
// /metrics read every scrape.
type ladder struct {
	name           string
	levels         []int
	hold, scrape   time.Duration
	prompt, output int
}

// decodeLadder's batch grows to 64 with short prompts: its latency is the
// decode step's. prefillLadder's long prompts and short answers make the
// engine's prefill its bottleneck from 8 clients on: requests queue while
// the KV cache is nearly empty.
var (
	decodeLadder  = ladder{name: "ladder", levels: []int{1, 2, 4, 8, 16, 32, 64}, hold: 60 * time.Second, scrape: 2 * time.Second, prompt: 1000, output: 100}
	prefillLadder = ladder{name: "prefill-ladder", levels: []int{1, 8, 16}, hold: 60 * time.Second, scrape: 2 * time.Second, prompt: 8000, output: 4}
)

// atPrefix starts the line before each exposition: the model time of the
// scrape as Unix nanoseconds.
const atPrefix = "# AT "

func (l ladder) file(flavour string) string {
	return "../capacity/testdata/" + flavour + "-" + l.name + ".txt.gz"
}

// record runs the default engine of flavour (the simulator's Qwen3-32B on
// 2xH100 calibration) through the ladder in model time and returns every
// scrape of its /metrics handler (the one the simulator's server mounts)
// in the recording format.
func (l ladder) record(t *testing.T, flavour string) []byte {
	clock := newFakeClock() // as the engine's clock: model time
	e, err := engine.New(engine.Config{Flavour: flavour}, nil, nil, engine.WithClock(clock))
	require.NoError(t, err)
	handler := promhttp.HandlerFor(e.Registry(), promhttp.HandlerOpts{})
	var out bytes.Buffer
	scrape := func() {
		req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		req.Header.Set("Accept", "text/plain;version=0.0.4")
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		require.Equal(t, http.StatusOK, rec.Code)
		fmt.Fprintf(&out, "%s%d\n", atPrefix, clock.Now().UnixNano())
		out.Write(rec.Body.Bytes())
	}

	rng := rand.New(rand.NewPCG(uint64(len(flavour)), 11))
	output := make([]uint32, l.output)
	for i := range output {
		output[i] = uint32(1000 + i)
	}
	submit := func(n int) <-chan engine.Update {
		prompt := make([]uint32, l.prompt)
		for i := range prompt {
			prompt[i] = rng.Uint32N(150_000)
		}
		ch, err := e.Submit(context.Background(), &engine.Request{ID: "r", Prompt: prompt, Output: output[:n]})
		require.NoError(t, err)
		return ch
	}
	var clients []<-chan engine.Update
	start := clock.Now()
	scrape()
	nextScrape := start.Add(l.scrape)
	for li, level := range l.levels {
		// New clients start with a random output length so that they
		// do not finish in lockstep.
		for len(clients) < level {
			clients = append(clients, submit(1+rng.IntN(l.output)))
		}
		end := start.Add(time.Duration(li+1) * l.hold)
		for clock.Now().Before(end) {
			require.NotZero(t, e.Step(), "engine idle with clients waiting")
			clock.set(e.WallTime(e.Snapshot().ModelTime))
			for i, ch := range clients {
				for drained := false; !drained; {
					select {
					case u, ok := <-ch:
						if !ok {
							drained = true
							break
						}
						if u.Done {
							require.NoError(t, u.Err)
							clients[i] = submit(l.output)
							drained = true
						}
					default:
						drained = true
					}
				}
			}
			// Scrapes land between steps, after the clients whose request
			// finished have sent the next one: it shows as waiting.
			if !clock.Now().Before(nextScrape) {
				scrape()
				nextScrape = nextScrape.Add(l.scrape)
			}
		}
	}
	return out.Bytes()
}

// scrapeAt is one recorded exposition.
type scrapeAt struct {
	at   time.Time
	text []byte
}

// readLadder reads a recording written by ladder.record.
func readLadder(t *testing.T, path string) []scrapeAt {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	require.NoError(t, err)
	data, err := io.ReadAll(zr)
	require.NoError(t, err)
	var out []scrapeAt
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if ns, ok := strings.CutPrefix(line, atPrefix); ok {
			v, err := strconv.ParseInt(ns, 10, 64)
			require.NoError(t, err, "bad %q line", line)
			out = append(out, scrapeAt{at: time.Unix(0, v)})
			continue
		}
		require.NotEmpty(t, out, "exposition before the first %q line", atPrefix)
		last := &out[len(out)-1]
		last.text = append(append(last.text, line...), '\n')
	}
	require.NoError(t, sc.Err())
	return out
}

// scrapes returns the ladder's recording for flavour, recorded anew first
// under -update.
func (l ladder) scrapes(t *testing.T, flavour string) []scrapeAt {
	if *updateSeries {
		writeLadder(t, l.file(flavour), l.record(t, flavour))
	}
	out := readLadder(t, l.file(flavour))
	require.GreaterOrEqual(t, len(out), len(l.levels)*int(l.hold/l.scrape))
	return out
}

func writeLadder(t *testing.T, path string, data []byte) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	require.NoError(t, err)
	_, err = zw.Write(data)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o644))
}

// replayLadder feeds a recording through the EPP's own path: each
// exposition parsed as a scrape at its model time, the window derived from
// the previous scrape as the scraper derives it, and the sample handed to a
// scheduler with one replica behind that metrics URL (Observe, which learns
// the replica's curve). It returns the learnt curve.
func replayLadder(t *testing.T, scrapes []scrapeAt) capacity.Curve {
	env := newEnv(t, 1, nil)
	url := env.rep(0).ep.MetricsURL
	var prev *metrics.Sample
	for i, sc := range scrapes {
		next := &metrics.Sample{URL: url, At: sc.at}
		require.NoError(t, metrics.Parse(sc.text, &next.Signals), "scrape %d", i)
		require.NotZero(t, next.Signals.Has&metrics.HasTTFT, "scrape %d has no TTFT histogram", i)
		require.NotZero(t, next.Signals.Has&metrics.HasITL, "scrape %d has no ITL histogram", i)
		if prev != nil {
			next.DeriveFrom(prev)
			require.Positive(t, next.Window.Seconds, "scrape %d: no window from a steady engine", i)
		}
		env.s.Observe(next)
		prev = next
	}
	snap := env.s.Capacity()
	require.Len(t, snap.Models, 1)
	require.Len(t, snap.Models[0].ReplicaCapacity, 1)
	return snap.Models[0].ReplicaCapacity[0].Curve
}

// TestRecordedSeries replays the simulator's ladder, in vLLM's and
// SGLang's metric names, through the EPP's scrape path and checks the
// capacity curve it learns against the ladder and the simulator's
// step-time model.
func TestRecordedSeries(t *testing.T) {
	// Tolerances, from what the ladder does rather than from one run:
	//   - concTol: a scrape lands between steps, so a client between two
	//     requests (about level/100 of them with 100-token outputs) is in
	//     neither count, and the one window across each level change
	//     averages the two levels; both pull a bin's mean by at most a few
	//     percent.
	//   - itlTol: the step-time model below is bracketed (prefill steps'
	//     fixed cost shared or not, decodes' weight read hidden or not),
	//     and the decode batch is read from the scrapes' running gauge; 5%
	//     either side of the bracket covers that approximation (the
	//     recordings stay within 2.5%).
	const concTol, itlTol = 0.05, 0.05
	ti := engine.DefaultTiming()
	budget := float64(engine.Config{}.WithDefaults().MaxNumBatchedTokens)
	for _, flavour := range []string{engine.FlavourVLLM, engine.FlavourSGLang} {
		t.Run(flavour, func(t *testing.T) {
			l := decodeLadder
			scrapes := l.scrapes(t, flavour)
			c := replayLadder(t, scrapes)
			require.NoError(t, c.Validate())

			prevITL := 0.0
			for _, level := range l.levels {
				b := binAt(c, level)
				lv := float64(level)
				require.InDelta(t, lv, b.Concurrency, concTol*lv, "no bin at %d clients", level)
				require.Greater(t, b.Seconds, l.hold.Seconds()/2, "batch size %d: most of its windows elsewhere", level)
				require.GreaterOrEqual(t, b.ITL.Count, float64(capacity.MinSamples), "batch size %d", level)
				itl := b.ITL.Sum / b.ITL.Count
				require.Greater(t, itl, prevITL, "mean ITL does not grow at batch size %d", level)
				prevITL = itl

				// The step-time model: a decode step of the bin's batch and
				// KV occupancy costs s; a decoding request also waits for
				// the other clients' prefills (every prefill but its own),
				// a share p*(n-1)/n of the engine's time, where p is the
				// time prefilling adds: the prompt tokens' cost plus a
				// fixed cost per prefill step. Prefills may share a step,
				// so there is one such step per prompt at most and one per
				// step budget of prompt tokens at least, hence the
				// bracket. SGLang's prefill steps run alone and add
				// PrefillBase; vLLM's carry the decodes, and their
				// chunk's compute hides the decodes' weight read, so they
				// add PrefillBase - DecodeBase (negative: the more steps,
				// the less p).
				s := ti.DecodeBase.Seconds() + ti.DecodePerSeq.Seconds()*b.Running + ti.KVTerm.Seconds()*b.KVUsage
				perStep := ti.PrefillBase.Seconds()
				if flavour == engine.FlavourVLLM {
					perStep -= ti.DecodeBase.Seconds()
				}
				most, least := b.PromptTokensPerSec/float64(l.prompt), b.PromptTokensPerSec/budget
				pLo := b.PromptTokensPerSec*ti.PrefillPerToken.Seconds() + min(most*perStep, least*perStep)
				pHi := b.PromptTokensPerSec*ti.PrefillPerToken.Seconds() + max(most*perStep, least*perStep)
				others := (b.Running - 1) / b.Running
				lo, hi := s/(1-pLo*others), s/(1-pHi*others)
				require.True(t, itl >= lo*(1-itlTol) && itl <= hi*(1+itlTol),
					"batch size %d: mean ITL %.2fms, step-time model %.2f..%.2fms", level, 1000*itl, 1000*lo, 1000*hi)
			}

			// An ITL objective the lower of two levels meets with margin
			// (below its (1+q)/2 quantile: at a Poisson mean the batch is
			// above it half the time) and the upper one misses (above its q
			// quantile) reads a capacity between them. Levels the engine's
			// buckets cannot tell apart (vLLM's first ITL bucket holds
			// every batch up to 8) are skipped; enough pairs must remain.
			//
			// The recording's running count spreads as a ladder's does
			// (levels change under the measured window), not as the
			// Poisson occupancy the margin assumes: read it as Poisson.
			require.Positive(t, c.Dispersion, "the recording's spread is measured")
			c.Dispersion = 0
			// The load read at the objectives, before the load held at its
			// rate bounds it: a closed ladder's spans hold its levels.
			require.NotEmpty(t, c.Sustained, "the recording's spans are kept")
			c.Sustained = nil
			pairs := 0
			for _, q := range []float64{0.5, 0.9, 0.95} {
				for i := 0; i+1 < len(l.levels); i++ {
					a, b := binAt(c, l.levels[i]), binAt(c, l.levels[i+1])
					xa, xb := quantileOf(&a.ITL, c.ITLBounds, (1+q)/2), quantileOf(&b.ITL, c.ITLBounds, q)
					if xa >= xb {
						continue
					}
					pairs++
					o := capacity.Objectives{ITL: time.Duration((xa + xb) / 2 * float64(time.Second)), TTFT: time.Hour, Quantile: q}
					at, err := c.At(o)
					require.NoError(t, err)
					require.True(t, at.Concurrency > a.Concurrency && at.Concurrency < b.Concurrency,
						"q%.2f ITL %v (between %d and %d clients): capacity %.2f", q, o.ITL, l.levels[i], l.levels[i+1], at.Concurrency)
				}
			}
			require.GreaterOrEqual(t, pairs, 4, "too few ladder levels told apart by the ITL histogram")
		})
	}
}

// TestRecordedStalls replays the decode ladder, in vLLM's and SGLang's
// metric names, and checks the stall curve it learns against the ladder:
// an ITL objective between two levels' quantiles reads a prefill load
// between the two levels' new-token rates.
func TestRecordedStalls(t *testing.T) {
	for _, flavour := range []string{engine.FlavourVLLM, engine.FlavourSGLang} {
		t.Run(flavour, func(t *testing.T) {
			l := decodeLadder
			c := replayLadder(t, l.scrapes(t, flavour))
			require.NotEmpty(t, c.Stall)
			newPerOut := c.Prefill.NewTokens / c.Prefill.OutputTokens
			require.InDelta(t, float64(l.prompt)/float64(l.output), newPerOut, 0.1*float64(l.prompt)/float64(l.output),
				"every prompt is new")
			pairs := 0
			for _, q := range []float64{0.5, 0.9, 0.95} {
				for i := 0; i+1 < len(l.levels); i++ {
					a, b := binAt(c, l.levels[i]), binAt(c, l.levels[i+1])
					xa, xb := quantileOf(&a.ITL, c.ITLBounds, q), quantileOf(&b.ITL, c.ITLBounds, q)
					if xa >= xb {
						continue
					}
					pairs++
					o := capacity.Objectives{ITL: time.Duration((xa + xb) / 2 * float64(time.Second)), TTFT: time.Hour, Quantile: q}
					bound, ok := c.StallBound(o)
					require.True(t, ok, "q%.2f ITL %v: no crossing", q, o.ITL)
					x := bound * newPerOut
					require.True(t, x > a.PromptTokensPerSec && x < b.PromptTokensPerSec,
						"q%.2f ITL %v (between %d and %d clients): %.0f new tokens/s, the levels' %.0f and %.0f",
						q, o.ITL, l.levels[i], l.levels[i+1], x, a.PromptTokensPerSec, b.PromptTokensPerSec)
				}
			}
			require.GreaterOrEqual(t, pairs, 4, "too few ladder levels told apart by the ITL histogram")
		})
	}
}

// binAt is the bin whose concurrency is nearest level.
func binAt(c capacity.Curve, level int) *capacity.Bin {
	var best *capacity.Bin
	for i := range c.Bins {
		if best == nil || math.Abs(c.Bins[i].Concurrency-float64(level)) < math.Abs(best.Concurrency-float64(level)) {
			best = &c.Bins[i]
		}
	}
	return best
}

// quantileOf inverts Histogram.Within (the reading At makes): the latency
// at which the share within reaches q.
func quantileOf(h *capacity.Histogram, bounds []float64, q float64) float64 {
	lo, hi := 0.0, bounds[len(bounds)-1]
	for hi-lo > 1e-7 {
		mid := (lo + hi) / 2
		if h.Within(bounds, mid) >= q {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// TestRecordedPrefill replays a ladder whose bottleneck is the engine's
// prefill, in vLLM's and SGLang's metric names, through the EPP's scrape
// path and checks the prefill rate and mix it learns against the ladder
// and the simulator's step-time model, and that the bound they set is the
// one a quote is read at.
func TestRecordedPrefill(t *testing.T) {
	ti := engine.DefaultTiming()
	budget := float64(engine.Config{}.WithDefaults().MaxNumBatchedTokens)
	l := prefillLadder
	// A queued step spends the budget: with d requests decoding, budget-d
	// prefill tokens in PrefillBase + PerToken*(budget-d), plus the decode
	// part. No decode (d=0) bounds the rate above; every client decoding
	// and a KV term of a tenth of the cache (the recording's KV stays
	// below that), below. tol covers windows straddling a change of level.
	const tol = 0.02
	d := float64(l.levels[len(l.levels)-1])
	hi := budget / (ti.PrefillBase.Seconds() + budget*ti.PrefillPerToken.Seconds())
	lo := (budget - d) / (ti.PrefillBase.Seconds() + (budget-d)*ti.PrefillPerToken.Seconds() +
		ti.DecodeBase.Seconds() + d*ti.DecodePerSeq.Seconds() + 0.1*ti.KVTerm.Seconds())
	for _, flavour := range []string{engine.FlavourVLLM, engine.FlavourSGLang} {
		t.Run(flavour, func(t *testing.T) {
			c := replayLadder(t, l.scrapes(t, flavour))
			require.NoError(t, c.Validate())
			p := c.Prefill
			require.Positive(t, p.QueuedSeconds, "the top levels queue")
			require.Less(t, p.QueuedSeconds, float64(len(l.levels)-1)*l.hold.Seconds()+l.scrape.Seconds(), "one client never queues")
			rate := p.QueuedTokens / p.QueuedSeconds
			t.Logf("prefill rate %.0f tokens/s over %.0f s, step-time model %.0f..%.0f", rate, p.QueuedSeconds, lo, hi)
			require.LessOrEqual(t, rate, hi*(1+tol), "prefill rate %.0f tokens/s, step-time model at most %.0f", rate, hi)
			require.GreaterOrEqual(t, rate, lo*(1-tol), "prefill rate %.0f tokens/s, step-time model %.0f..%.0f", rate, lo, hi)
			require.InDelta(t, float64(l.prompt), p.NewTokens/p.Requests, 0.05*float64(l.prompt), "new prompt tokens a request")
			require.InDelta(t, float64(l.output), p.OutputTokens/p.Requests, 0.1*float64(l.output), "output tokens a request")

			// 16 closed-loop clients keep the prefill at its full rate
			// with a mean TTFT under 7 s, within the objective; arrivals
			// at that rate would queue without end. The bound, below what
			// the bins alone sell, is what the curve is read at.
			o := capacity.Objectives{TTFT: 10 * time.Second, ITL: time.Hour, Quantile: 0.95}
			bound, ok := p.Bound(o)
			require.True(t, ok)
			mu := rate / (p.NewTokens / p.Requests)
			require.InDelta(t, (mu-math.Log(20)/o.TTFT.Seconds())*p.OutputTokens/p.Requests, bound, 1e-9)
			at, err := c.At(o)
			require.NoError(t, err)
			require.Equal(t, capacity.LimitPrefill, at.Limit)
			require.InDelta(t, bound, at.OutputTokensPerSec, 1e-9)
		})
	}
}

// The prompt tokens an engine computed: its prefix cache's queries minus
// hits, every prompt token when it exports no prefix-cache counters.
func TestNewPromptTokensPerSec(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		has                   uint32
		prompt, queries, hits float64
		want                  float64
	}{
		{"queries minus hits", metrics.HasPrefixQueries | metrics.HasPrefixHits | metrics.HasPromptTokens, 900, 1000, 600, 400},
		{"no prefix counters", metrics.HasPromptTokens, 900, 0, 0, 900},
		{"hits above queries (counters read apart)", metrics.HasPrefixQueries | metrics.HasPrefixHits, 0, 100, 120, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sm := &metrics.Sample{Signals: metrics.Signals{Has: tc.has}, PromptTokensPerSec: tc.prompt,
				PrefixQueriesPerSec: tc.queries, PrefixHitsPerSec: tc.hits}
			require.InDelta(t, tc.want, newPromptTokensPerSec(sm), 1e-9)
		})
	}
}
