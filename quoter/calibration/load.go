package calibration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/engines/openai"
)

// generator is the ladder's load: workers sending streamed chat
// completions over one client, each measured into the recorder while it
// is on.
type generator struct {
	cfg      *Config
	endpoint string
	prompts  *prompts // the preflight's
	// wordsPerToken is the prompts' words for each of the mix's tokens, as
	// the preflight fitted it.
	wordsPerToken float64
	// measured is what the engine counted of the last preflight prompt.
	measured int
	rec      recorder
	crew     crew
	// worker is one worker's loop (work) and measure a level's
	// measurement (level); tests replace them to replay a ladder.
	worker  func(ctx context.Context, p *prompts)
	measure func(ctx context.Context, c int) (capacity.Level, error)
}

func newGenerator(cfg *Config) *generator {
	g := &generator{cfg: cfg, endpoint: strings.TrimSuffix(cfg.URL, "/") + "/v1/chat/completions",
		prompts: newPrompts(cfg.Mix, cfg.Seed, math.MaxUint64, 1), wordsPerToken: 1}
	g.worker, g.measure = g.work, g.level
	return g
}

// Fitting the prompts: at most maxFits preflight requests, until the
// engine counts the mix's prompt tokens within fitTolerance.
const (
	maxFits      = 4
	fitTolerance = 0.02
)

// preflight sends the first requests. A URL that cannot serve the stream
// fails with its own error at once, not after a level of them. And the
// prompts are fitted to the mix's length in the engine's own tokens (its
// usage's prompt tokens): a word of random letters is one token or more
// depending on the tokenizer, and the chat template adds some, so a mix
// written in words would drive other prompts than the one asked for.
// Each fit scales the words by the tokens asked over the tokens counted,
// which settles in a step or two as the template's share is small.
func (g *generator) preflight(ctx context.Context) error {
	want := float64(g.cfg.Mix.PromptTokens)
	for range maxFits {
		res := g.request(ctx, g.prompts.next())
		if res.err != nil {
			return fmt.Errorf("%s cannot serve a calibration request: %w", g.cfg.URL, res.err)
		}
		g.measured = res.promptTokens
		if res.promptTokens <= 0 {
			g.cfg.Log.Warn("the engine's usage has no prompt tokens: the prompts are not fitted to the mix's length")
			return nil
		}
		if math.Abs(float64(res.promptTokens)-want) <= fitTolerance*want {
			break
		}
		g.wordsPerToken *= want / float64(res.promptTokens)
		g.prompts = newPrompts(g.cfg.Mix, g.cfg.Seed, math.MaxUint64, g.wordsPerToken)
	}
	g.cfg.Log.Info("prompts fitted", zap.Int("prompt_tokens", g.cfg.Mix.PromptTokens), zap.Int("measured", g.measured),
		zap.Float64("words_per_token", g.wordsPerToken))
	return nil
}

// ladder runs the levels and returns them: the climb (climb), then the
// repeats that confirm its top (confirm). Workers run in a crew: added
// on the way up, so the requests in flight carry over and a level starts
// loaded (its warmup absorbs the step), and stopped from the last on the
// way down.
func (g *generator) ladder(ctx context.Context) ([]capacity.Level, error) {
	wctx, cancel := context.WithCancel(ctx)
	g.crew = crew{ctx: wctx}
	defer g.crew.wg.Wait()
	defer cancel() // before Wait: the workers end on it
	levels, err := g.climb(ctx)
	if err != nil {
		return levels, err
	}
	return g.confirm(ctx, levels)
}

// climb runs the levels up, the last being PastBreak levels past the
// first outside the objectives, or the maximum concurrency.
func (g *generator) climb(ctx context.Context) ([]capacity.Level, error) {
	var levels []capacity.Level
	past := -1 // levels measured past the first break
	for c := g.cfg.StartConcurrency; ; c = next(c, g.cfg.Factor, g.cfg.MaxConcurrency) {
		g.resize(c)
		lv, err := g.measure(ctx, c)
		if err != nil && past >= 0 && ctx.Err() == nil {
			// Past the edge errors are the overload, not a broken URL: the
			// levels up to here stand.
			g.cfg.Log.Info("level past the first break failed; the ladder stops", zap.Int("concurrency", c), zap.Error(err))
			return levels, nil
		}
		if err != nil {
			return levels, err
		}
		levels = append(levels, lv)
		g.logLevel("level measured", lv)
		if !lv.Within && past < 0 {
			if len(levels) == 1 {
				return nil, fmt.Errorf("%s breaks its objectives at concurrency %d: %s", g.cfg.URL, c, broken(lv, g.cfg.Objectives))
			}
			past = 0
		} else if past >= 0 {
			past++
		}
		if past >= *g.cfg.PastBreak || c >= g.cfg.MaxConcurrency {
			return levels, nil
		}
	}
}

// confirm measures the climb's highest level within the objectives again
// and, while a repeat breaks, the next such level below it, at most
// Repeats levels, until one holds twice. A level counts only if every
// measurement of it held (capacity.Calibration.HeldStreams), so a top
// held once by luck at the edge is not what the quote sells
// (TestLadderConfirms). A repeat whose requests fail broke: that level is
// not held. Every level refuted fails the run, as a first level that
// breaks does.
func (g *generator) confirm(ctx context.Context, levels []capacity.Level) ([]capacity.Level, error) {
	var held []int // the climb's levels within, highest first
	for _, lv := range slices.Backward(levels) {
		if lv.Within {
			held = append(held, lv.Concurrency)
		}
	}
	repeats := min(*g.cfg.Repeats, len(held))
	for i, c := range held[:repeats] {
		g.resize(c)
		lv, err := g.measure(ctx, c)
		if err != nil && (ctx.Err() != nil || !lv.Failed()) {
			return levels, err
		}
		levels = append(levels, lv)
		g.logLevel("level repeated", lv)
		if lv.Within {
			return levels, nil
		}
		if i == len(held)-1 {
			return nil, fmt.Errorf("%s held no level when measured again: concurrency %d held before and now %s", g.cfg.URL, c, g.why(lv, err))
		}
	}
	if repeats > 0 {
		g.cfg.Log.Warn("no level held twice within the repeats; the highest not refuted was measured once",
			zap.Int("repeats", repeats), zap.Int("concurrency", held[repeats]))
	}
	return levels, nil
}

// why says how a level broke: its failures' error, or the objectives and
// the numbers.
func (g *generator) why(lv capacity.Level, err error) string {
	if err != nil {
		return err.Error()
	}
	return broken(lv, g.cfg.Objectives)
}

func (g *generator) logLevel(msg string, lv capacity.Level) {
	g.cfg.Log.Info(msg, zap.Int("concurrency", lv.Concurrency), zap.Int("requests", lv.Requests), zap.Int("errors", lv.Errors),
		zap.Float64("ttft_p95_seconds", lv.TTFTP95Seconds), zap.Float64("itl_p95_seconds", lv.ITLP95Seconds),
		zap.Float64("output_tokens_per_sec", lv.OutputTokensPerSec), zap.Bool("within", lv.Within))
}

// crew is the ladder's workers: each one's stop, in the order started.
type crew struct {
	ctx     context.Context // the ladder's: every worker ends with it
	wg      sync.WaitGroup
	stops   []context.CancelFunc
	started uint64 // workers ever started, each one's prompts stream
}

// resize runs n workers: it starts new ones, each with prompts no earlier
// worker sent, or stops the last started, whose request in flight is
// cancelled and not counted (request).
func (g *generator) resize(n int) {
	w := &g.crew
	for len(w.stops) < n {
		ctx, stop := context.WithCancel(w.ctx)
		w.stops = append(w.stops, stop)
		p := newPrompts(g.cfg.Mix, g.cfg.Seed, w.started, g.wordsPerToken)
		w.started++
		w.wg.Go(func() { g.worker(ctx, p) })
	}
	for len(w.stops) > n {
		w.stops[len(w.stops)-1]()
		w.stops = w.stops[:len(w.stops)-1]
	}
}

// level waits out the warmup, measures for the level duration and
// summarises what the recorder saw.
func (g *generator) level(ctx context.Context, c int) (capacity.Level, error) {
	if err := sleep(ctx, *g.cfg.Warmup); err != nil {
		return capacity.Level{}, fmt.Errorf("calibration stopped at concurrency %d: %w", c, err)
	}
	g.rec.start()
	err := sleep(ctx, g.cfg.LevelDuration)
	s := g.rec.stop()
	if err != nil {
		return capacity.Level{}, fmt.Errorf("calibration stopped at concurrency %d: %w", c, err)
	}
	return summarise(c, s, g.cfg.LevelDuration, g.cfg.Objectives)
}

// summarise is a level from what was measured in it. A level whose
// requests failed (capacity.Level.Failed) comes with its error and its
// p95s where it measured any, never within.
func summarise(c int, s stats, d time.Duration, o capacity.Objectives) (capacity.Level, error) {
	lv := capacity.Level{Concurrency: c, Requests: s.requests, Errors: s.errors,
		OutputTokensPerSec: float64(s.tokens) / d.Seconds()}
	if len(s.ttft) > 0 {
		lv.TTFTP95Seconds = quantile(s.ttft, o.Quantile)
	}
	if len(s.itl) > 0 {
		lv.ITLP95Seconds = quantile(s.itl, o.Quantile)
	}
	if lv.Failed() {
		return lv, fmt.Errorf("%d of %d requests failed at concurrency %d (more than %.0f%%); the first: %w",
			s.errors, s.requests, c, 100*MaxErrorShare, s.firstErr)
	}
	if len(s.ttft) == 0 || len(s.itl) == 0 {
		return lv, fmt.Errorf("concurrency %d measured no first token or no inter-token gap in %v: lengthen the level duration", c, d)
	}
	lv.Within = lv.TTFTP95Seconds <= o.TTFT.Seconds() && lv.ITLP95Seconds <= o.ITL.Seconds()
	return lv, nil
}

// broken says which objectives a level broke, with the numbers.
func broken(lv capacity.Level, o capacity.Objectives) string {
	var out []string
	p := fmt.Sprintf("p%g", 100*o.Quantile)
	if lv.TTFTP95Seconds > o.TTFT.Seconds() {
		out = append(out, fmt.Sprintf("TTFT %s %s > %s", p, seconds(lv.TTFTP95Seconds), o.TTFT))
	}
	if lv.ITLP95Seconds > o.ITL.Seconds() {
		out = append(out, fmt.Sprintf("ITL %s %s > %s", p, seconds(lv.ITLP95Seconds), o.ITL))
	}
	return strings.Join(out, ", ")
}

// seconds is a latency rounded to two or three significant digits, for
// messages and the table.
func seconds(s float64) time.Duration {
	d := time.Duration(s * float64(time.Second))
	for _, r := range []time.Duration{100 * time.Millisecond, 10 * time.Millisecond, time.Millisecond, 10 * time.Microsecond} {
		if d >= 10*r {
			return d.Round(r)
		}
	}
	return d.Round(time.Microsecond)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// errorPause is how long a worker waits after a failed request, so a URL
// that fails at once is not hammered in a tight loop.
const errorPause = 100 * time.Millisecond

// work sends requests back to back until ctx ends: the closed loop.
func (g *generator) work(ctx context.Context, p *prompts) {
	for ctx.Err() == nil {
		if res := g.request(ctx, p.next()); res.err != nil && ctx.Err() == nil {
			_ = sleep(ctx, errorPause)
		}
	}
}

// result is one request as the client saw it.
type result struct {
	tokens, promptTokens int // the usage's
	err                  error
}

// maxErrorBody bounds what an error response contributes to the error.
const maxErrorBody = 512

// request sends one streamed completion and measures it into the
// recorder: the time to the first chunk with content, and the gap before
// every later one.
func (g *generator) request(ctx context.Context, prompt string) (res result) {
	defer func() {
		if ctx.Err() == nil { // a cancelled run's requests are not the server's failures
			g.rec.done(res.tokens, res.err)
		}
	}()
	rctx, cancel := context.WithTimeout(ctx, g.cfg.RequestTimeout)
	defer cancel()
	n := g.cfg.Mix.OutputTokens
	body, err := json.Marshal(map[string]any{"model": g.cfg.Model, "stream": true,
		"stream_options": map[string]any{"include_usage": true},
		"messages":       []any{map[string]any{"role": "user", "content": prompt}},
		// vLLM's extra sampling parameters hold the output length fixed.
		"max_tokens": n, "min_tokens": n, "ignore_eos": true})
	if err != nil {
		return result{err: fmt.Errorf("cannot encode the request: %w", err)}
	}
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, g.endpoint, bytes.NewReader(body))
	if err != nil {
		return result{err: fmt.Errorf("cannot build the request: %w", err)}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set(Header, "1")
	if g.cfg.token != "" {
		req.Header.Set(TokenHeader, g.cfg.token)
	}
	sent := time.Now()
	resp, err := g.cfg.HTTP.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return result{err: fmt.Errorf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))}
	}
	// A stream is about a hundred bytes per token; the bound leaves room
	// for an engine that sends much more and stops one that never ends.
	stream := io.LimitReader(resp.Body, 1<<20+int64(n)*4096)
	last := time.Time{}
	usage, promptTokens := -1, 0
	for ev, err := range openai.Events(stream, 1<<20) {
		if err != nil {
			return result{err: fmt.Errorf("cannot read the stream: %w", err)}
		}
		if ev.Done {
			if usage < 0 {
				return result{err: errors.New("the stream carried no usage (stream_options.include_usage)")}
			}
			return result{tokens: usage, promptTokens: promptTokens}
		}
		var ch chunk
		if err := json.Unmarshal(ev.Data, &ch); err != nil {
			return result{err: fmt.Errorf("bad stream chunk: %w", err)}
		}
		if ch.Error != nil {
			return result{err: fmt.Errorf("the stream failed: %s", ch.Error.Message)}
		}
		if ch.Usage != nil {
			usage, promptTokens = ch.Usage.CompletionTokens, ch.Usage.PromptTokens
		}
		if !ch.hasContent() {
			continue
		}
		if last.IsZero() {
			g.rec.firstToken(ev.At.Sub(sent))
		} else {
			g.rec.gap(ev.At.Sub(last))
		}
		last = ev.At
	}
	return result{err: errors.New("the stream ended before [DONE]")}
}

// chunk is what the load reads of a chat.completion.chunk.
type chunk struct {
	Choices []struct {
		Delta struct {
			Content          string `json:"content"`
			ReasoningContent string `json:"reasoning_content"`
			Reasoning        string `json:"reasoning"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int `json:"completion_tokens"`
		PromptTokens     int `json:"prompt_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// hasContent is whether the chunk carries generated text (a reasoning
// model's thinking is generated tokens too).
func (c *chunk) hasContent() bool {
	for _, ch := range c.Choices {
		if d := ch.Delta; d.Content != "" || d.ReasoningContent != "" || d.Reasoning != "" {
			return true
		}
	}
	return false
}

// recorder collects what the workers measure while a level is measured,
// and drops it otherwise (warmups, the preflight).
type recorder struct {
	mu sync.Mutex
	on bool
	s  stats
}

type stats struct {
	ttft, itl                []float64
	requests, errors, tokens int
	firstErr                 error
}

func (r *recorder) start() {
	r.mu.Lock()
	r.on, r.s = true, stats{}
	r.mu.Unlock()
}

func (r *recorder) stop() stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on = false
	s := r.s
	r.s = stats{}
	return s
}

func (r *recorder) firstToken(d time.Duration) {
	r.mu.Lock()
	if r.on {
		r.s.ttft = append(r.s.ttft, d.Seconds())
	}
	r.mu.Unlock()
}

func (r *recorder) gap(d time.Duration) {
	r.mu.Lock()
	if r.on {
		r.s.itl = append(r.s.itl, d.Seconds())
	}
	r.mu.Unlock()
}

func (r *recorder) done(tokens int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.on {
		return
	}
	r.s.requests++
	if err != nil {
		r.s.errors++
		if r.s.firstErr == nil {
			r.s.firstErr = err
		}
		return
	}
	r.s.tokens += tokens
}

// quantile is the nearest-rank q-quantile of xs (the smallest value with
// at least q of the observations at or below it); it sorts xs. NaN for
// none.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	slices.Sort(xs)
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

// prompts makes one worker's prompts: the mix's PromptTokens in words,
// wordsPerToken of them a token, the first SharedPrefixTokens' worth one
// group's prefix (a group drawn per prompt), the rest random words, so
// only the prefix can hit a cache.
type prompts struct {
	rng      *rand.Rand
	prefixes []string
	words    int // after the prefix
	b        strings.Builder
}

// newPrompts seeds the group prefixes from seed alone, so every worker
// shares them, and the rest from (seed, stream), so no two workers send
// the same words.
func newPrompts(m capacity.Mix, seed int64, stream uint64, wordsPerToken float64) *prompts {
	words := func(tokens int) int { return max(int(math.Round(float64(tokens)*wordsPerToken)), min(tokens, 1)) }
	prefix := words(m.SharedPrefixTokens)
	p := &prompts{rng: rand.New(rand.NewPCG(uint64(seed), stream)), words: max(words(m.PromptTokens)-prefix, 0)}
	if prefix > 0 {
		rng := rand.New(rand.NewPCG(uint64(seed), math.MaxUint64-1))
		for range m.Groups {
			var b strings.Builder
			for i := range prefix {
				if i > 0 {
					b.WriteByte(' ')
				}
				word(&b, rng)
			}
			p.prefixes = append(p.prefixes, b.String())
		}
	}
	return p
}

func (p *prompts) next() string {
	p.b.Reset()
	if len(p.prefixes) > 0 {
		p.b.WriteString(p.prefixes[p.rng.IntN(len(p.prefixes))])
	}
	for range p.words {
		if p.b.Len() > 0 {
			p.b.WriteByte(' ')
		}
		word(&p.b, p.rng)
	}
	return p.b.String()
}

// word writes a random lowercase word of 3 to 8 letters: 26^3 or more
// choices per word, so two prompts' random parts differ from their first
// word.
func word(b *strings.Builder, rng *rand.Rand) {
	for range 3 + rng.IntN(6) {
		b.WriteByte(byte('a' + rng.IntN(26)))
	}
}
