package calibration

import (
	"context"
	"errors"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/omnious/provider-node/capacity"
)

// piece is what a canned engine writes and flushes after waiting its
// delay (from the previous piece, or from the request).
type piece struct {
	after time.Duration
	text  string
}

// pipeListener is a listener whose connections are in-memory pipes, so an
// http.Server runs inside a synctest bubble, where time is fake and a
// request's timing is exact.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 80} }

func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestRequestTiming pins what one calibration request measures: the
// first token is the first chunk with generated text (content or
// reasoning; not the role chunk), timed from sending the request to the
// arrival of its bytes; every later such chunk adds the gap since the
// previous one; usage gives the tokens; keep-alives, comments, CRLF and an
// event split across writes change nothing.
func TestRequestTiming(t *testing.T) {
	const (
		role  = `data: {"choices":[{"delta":{"role":"assistant","content":""}}]}` + "\n\n"
		done  = "data: [DONE]\n\n"
		usage = `data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}` + "\n\n"
	)
	content := func(s string) string { return `data: {"choices":[{"delta":{"content":"` + s + `"}}]}` + "\n\n" }
	ms := time.Millisecond
	for _, tc := range []struct {
		name         string
		pieces       []piece
		ttft, itl    []float64
		tokens, prom int
		err          string
	}{
		{"vllm shape", []piece{{50 * ms, role}, {50 * ms, content("a")}, {20 * ms, content("b")}, {30 * ms, content("c")}, {10 * ms, usage}, {0, done}},
			[]float64{0.1}, []float64{0.02, 0.03}, 3, 7, ""},
		{"reasoning counts, keep-alives do not", []piece{
			{100 * ms, `data: {"choices":[{"delta":{"reasoning_content":"hm"}}]}` + "\n\n"},
			{40 * ms, ": keep-alive\n\n"},
			{10 * ms, `data: {"choices":[{"delta":{"reasoning":"so"}}]}` + "\n\n"},
			{25 * ms, content("x")}, {0, usage}, {0, done}},
			[]float64{0.1}, []float64{0.05, 0.025}, 3, 7, ""},
		{"split across writes and CRLF", []piece{{80 * ms, `data: {"choices":[{"delta":`}, {20 * ms, `{"content":"a"}}]}` + "\r\n\r\n"},
			{15 * ms, "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\r"}, {0, "\n\r\n"}, {0, usage}, {0, done}},
			[]float64{0.1}, []float64{0.015}, 3, 7, ""},
		{"an error event ends it", []piece{{30 * ms, content("a")}, {10 * ms, `data: {"error":{"message":"boom"}}` + "\n\n"}, {0, content("b")}},
			[]float64{0.03}, nil, 0, 0, "the stream failed: boom"},
		{"no usage", []piece{{30 * ms, content("a")}, {0, done}}, []float64{0.03}, nil, 0, 0, "carried no usage"},
		{"truncated", []piece{{30 * ms, content("a")}, {5 * ms, content("b")}}, []float64{0.03}, []float64{0.005}, 0, 0, "ended before [DONE]"},
		{"not JSON", []piece{{30 * ms, "data: {\n\n"}}, nil, nil, 0, 0, "bad stream chunk"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := newPipeListener()
				srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "text/event-stream")
					for _, p := range tc.pieces {
						time.Sleep(p.after)
						if _, err := w.Write([]byte(p.text)); err != nil {
							return
						}
						w.(http.Flusher).Flush()
					}
				})}
				go func() { _ = srv.Serve(l) }()
				tr := &http.Transport{DialContext: l.dial}
				defer func() {
					tr.CloseIdleConnections()
					_ = srv.Close()
				}()
				g := newGenerator(&Config{URL: "http://engine", Model: "m", Mix: capacity.Mix{PromptTokens: 1, OutputTokens: 3},
					RequestTimeout: time.Minute, HTTP: &http.Client{Transport: tr}})
				g.rec.start()
				res := g.request(context.Background(), "hello")
				s := g.rec.stop()
				require.Equal(t, tc.ttft, s.ttft, "first token, seconds")
				require.Equal(t, tc.itl, s.itl, "gaps, seconds")
				require.Equal(t, 1, s.requests)
				if tc.err != "" {
					require.ErrorContains(t, res.err, tc.err)
					require.Equal(t, 1, s.errors)
					return
				}
				require.NoError(t, res.err)
				require.Equal(t, tc.tokens, res.tokens)
				require.Equal(t, tc.prom, res.promptTokens)
				require.Equal(t, tc.tokens, s.tokens)
			})
		})
	}
}

// TestLadderConfirms replays ladders through climb and confirm, each
// level's measurements scripted in the order the ladder asks for them,
// with the workers that run at each one counted. Attempts 9 and 10 are
// the real vLLM fleet's ladders (docs/notebook/2026-12-06-vllm/proof,
// attempt-9/ and attempt-10/, ITL p95 in ms), their repeats the first
// closed-loop check their proof ran at the streams it sold: 5 held
// (35.8 ms), 7 broke (92.0 ms); a repeat of attempt 10's 5 was never run,
// so both outcomes are replayed. old is the ladder's bound before
// repeats (the highest level held once), held the bound after.
func TestLadderConfirms(t *testing.T) {
	strict := capacity.Objectives{TTFT: 2 * time.Second, ITL: 50 * time.Millisecond, Quantile: 0.95}
	// lv is a level at concurrency c with its p95s in milliseconds.
	lv := func(c int, ttftMS, itlMS float64) capacity.Level {
		l := capacity.Level{Concurrency: c, Requests: 100, TTFTP95Seconds: ttftMS / 1000, ITLP95Seconds: itlMS / 1000, OutputTokensPerSec: 10 * float64(c)}
		l.Within = l.TTFTP95Seconds <= strict.TTFT.Seconds() && l.ITLP95Seconds <= strict.ITL.Seconds()
		return l
	}
	attempt9 := []capacity.Level{lv(2, 215, 18.4), lv(3, 394, 27.7), lv(4, 582, 32.3), lv(5, 688, 39.3), lv(7, 1078, 72.9), lv(9, 1182, 109.3)}
	attempt10 := []capacity.Level{lv(2, 222, 17.6), lv(3, 351, 18.5), lv(4, 661, 30.9), lv(5, 613, 34.5), lv(7, 1053, 32.8), lv(9, 770, 85.8), lv(12, 1775, 97.5)}
	// The simulated demo fleet's ladder (2026-12-06-capacity-demo), four
	// independent replicas: held to 60, broke at 75 and 94.
	var demo []capacity.Level
	for c := 4; c <= 94; c = next(c, 1.25, 94) {
		if c <= 60 {
			demo = append(demo, lv(c, 100, 30))
		} else {
			demo = append(demo, lv(c, 2900, 30))
		}
		if c == 94 {
			break
		}
	}
	with := func(ls []capacity.Level, more ...capacity.Level) []capacity.Level {
		return append(slices.Clone(ls), more...)
	}
	failing := capacity.Level{Concurrency: 5, Requests: 40, Errors: 10, TTFTP95Seconds: 0.5, ITLP95Seconds: 0.03}
	ptr := func(n int) *int { return &n }
	for _, tc := range []struct {
		name     string
		start    int
		max      int
		repeats  *int // nil: the default
		script   []capacity.Level
		fail     map[int]error // by the script's index: that measurement's error
		measured []int         // concurrencies, in order
		old      float64
		held     float64
		err      string
		warn     string // logged
	}{
		{name: "a clean ladder pays one repeat and loses nothing", start: 4, max: 200, script: with(demo, lv(60, 120, 31)),
			measured: []int{4, 5, 7, 9, 12, 15, 19, 24, 30, 38, 48, 60, 75, 94, 60}, old: 60, held: 60},
		{name: "attempt 9: its 5 held again", start: 2, max: 40, script: with(attempt9, lv(5, 675, 35.8)),
			measured: []int{2, 3, 4, 5, 7, 9, 5}, old: 5, held: 5},
		{name: "attempt 10: its 7 broke again, its 5 held", start: 2, max: 40, script: with(attempt10, lv(7, 453, 92.0), lv(5, 613, 34.5)),
			measured: []int{2, 3, 4, 5, 7, 9, 12, 7, 5}, old: 7, held: 5},
		{name: "attempt 10: its 7 broke again, and its 5", start: 2, max: 40, script: with(attempt10, lv(7, 453, 92.0), lv(5, 700, 60)),
			measured: []int{2, 3, 4, 5, 7, 9, 12, 7, 5}, old: 7, held: 4,
			warn: "no level held twice within the repeats; the highest not refuted was measured once"},
		{name: "attempt 10 with repeats off: the highest held once", start: 2, max: 40, repeats: ptr(0), script: attempt10,
			measured: []int{2, 3, 4, 5, 7, 9, 12}, old: 7, held: 7},
		{name: "never broke: the maximum repeated", start: 1, max: 3, script: []capacity.Level{lv(1, 100, 20), lv(2, 100, 25), lv(3, 100, 30), lv(3, 100, 31)},
			measured: []int{1, 2, 3, 3}, old: 3, held: 3},
		{name: "a held level above a broken one is repeated first, then the next held below both", start: 2, max: 40,
			script:   []capacity.Level{lv(2, 300, 32.9), lv(3, 500, 36.4), lv(4, 530, 63.9), lv(5, 740, 37.5), lv(5, 700, 55), lv(3, 500, 40)},
			measured: []int{2, 3, 4, 5, 5, 3}, old: 5, held: 3},
		{name: "a repeat whose requests fail broke", start: 2, max: 40, fail: map[int]error{6: errors.New("10 of 40 requests failed")},
			script: with(attempt9, failing, lv(4, 600, 33)), measured: []int{2, 3, 4, 5, 7, 9, 5, 4}, old: 5, held: 4},
		{name: "every level refuted: the run fails", start: 1, max: 40, repeats: ptr(3), script: []capacity.Level{lv(1, 100, 40), lv(2, 100, 45), lv(3, 100, 60), lv(4, 100, 70), lv(2, 100, 51), lv(1, 100, 52)},
			measured: []int{1, 2, 3, 4, 2, 1}, err: "held no level when measured again: concurrency 1 held before and now ITL p95 52ms > 50ms"},
		{name: "a repeat that cannot be measured fails the run", start: 2, max: 40, fail: map[int]error{6: errors.New("concurrency 5 measured no first token")},
			script: with(attempt9, capacity.Level{Concurrency: 5}), measured: []int{2, 3, 4, 5, 7, 9, 5}, err: "measured no first token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := Config{URL: "http://engine", Model: "m", CapacityURL: "http://epp", Objectives: strict, StartConcurrency: tc.start,
					MaxConcurrency: tc.max, Repeats: tc.repeats}.WithDefaults()
				core, logs := observer.New(zap.WarnLevel)
				cfg.Log = zap.New(core)
				g := newGenerator(&cfg)
				var running atomic.Int64
				g.worker = func(ctx context.Context, p *prompts) {
					running.Add(1)
					defer running.Add(-1)
					<-ctx.Done()
				}
				var measured []int
				g.measure = func(ctx context.Context, c int) (capacity.Level, error) {
					synctest.Wait() // every worker started or stopped
					require.Equal(t, int64(c), running.Load(), "workers running at concurrency %d", c)
					require.Less(t, len(measured), len(tc.script), "a level past the script: %d after %v", c, measured)
					l := tc.script[len(measured)]
					require.Equal(t, l.Concurrency, c, "level %d of the script", len(measured))
					measured = append(measured, c)
					return l, tc.fail[len(measured)-1]
				}
				levels, err := g.ladder(context.Background())
				synctest.Wait()
				require.Zero(t, running.Load(), "the workers end with the ladder")
				require.Equal(t, tc.measured, measured)
				var warned []string
				for _, e := range logs.All() {
					warned = append(warned, e.Message)
				}
				if tc.warn != "" {
					require.Equal(t, []string{tc.warn}, warned)
				} else {
					require.Empty(t, warned)
				}
				if tc.err != "" {
					require.ErrorContains(t, err, tc.err)
					return
				}
				require.NoError(t, err)
				require.Equal(t, uint64(slices.Max(measured)), g.crew.started,
					"workers are only started going up: one started again would send a stopped one's prompts")
				cal := &capacity.Calibration{Levels: levels, Objectives: capacity.ObjectivesJSON{Quantile: 0.95}}
				held, ok := cal.HeldStreams(strict)
				require.True(t, ok)
				require.Equal(t, tc.held, held, "held")
				n := 1 // the climb's levels: rising, before the repeats
				for n < len(levels) && levels[n].Concurrency > levels[n-1].Concurrency {
					n++
				}
				climb := &capacity.Calibration{Levels: levels[:n], Objectives: capacity.ObjectivesJSON{Quantile: 0.95}}
				old, _ := climb.HeldStreams(strict)
				require.Equal(t, tc.old, old, "held before repeats")
				t.Logf("levels %v: held %v once, %v confirmed", measured, old, held)
			})
		})
	}
}
