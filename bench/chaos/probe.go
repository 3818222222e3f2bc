package chaos

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// waitFor polls cond every 20ms until it holds, returning how long that
// took, or fails after limit.
func waitFor(ctx context.Context, limit time.Duration, cond func() (bool, error)) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(limit)
	var lastErr error
	for {
		ok, err := cond()
		if ok && err == nil {
			return time.Since(start), nil
		}
		lastErr = err
		if time.Now().After(deadline) {
			if lastErr != nil {
				return time.Since(start), fmt.Errorf("not within %v: %w", limit, lastErr)
			}
			return time.Since(start), fmt.Errorf("not within %v", limit)
		}
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// probe is one request of a background probe loop.
type probe struct {
	at, end time.Time
	status  int
	err     error
}

func (p probe) ok() bool { return p.err == nil && p.status == http.StatusOK }

// prober sends a fresh unpinned request every interval until stopped.
type prober struct {
	mu     sync.Mutex
	probes []probe
	cancel context.CancelFunc
	done   chan struct{}
}

// startProber sends requests from workers goroutines, one every interval
// each; prompt gives worker w's i-th prompt (nil: a fresh 60-word prompt).
func (env *world) startProber(ctx context.Context, tag string, every time.Duration, workers int, prompt func(w, i int) string) *prober {
	if prompt == nil {
		prompt = func(w, i int) string { return promptOf(fmt.Sprintf("%s-%d-%d", tag, w, i), 60) }
	}
	return env.startLoad(ctx, load{every: every, workers: workers, prompt: prompt, tokens: 4})
}

// load is a closed-loop client load: workers goroutines, each sending a
// request every interval (or as soon as the last one ended).
type load struct {
	every   time.Duration
	workers int
	prompt  func(w, i int) string
	// tokens is each request's max_tokens (ignore_eos: exactly that many).
	tokens int
	// stream sends streamed completions; one is ok only when it ended with
	// data: [DONE].
	stream bool
}

// startLoad runs l until the prober is stopped.
func (env *world) startLoad(ctx context.Context, l load) *prober {
	pctx, cancel := context.WithCancel(ctx)
	pr := &prober{cancel: cancel, done: make(chan struct{})}
	var wg sync.WaitGroup
	for w := 0; w < l.workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; pctx.Err() == nil; i++ {
				at := time.Now()
				rctx, rcancel := context.WithTimeout(pctx, 10*time.Second)
				status, err := env.once(rctx, l.prompt(w, i), l.tokens, l.stream)
				rcancel()
				if pctx.Err() != nil {
					return
				}
				pr.mu.Lock()
				pr.probes = append(pr.probes, probe{at: at, end: time.Now(), status: status, err: err})
				pr.mu.Unlock()
				select {
				case <-pctx.Done():
				case <-time.After(time.Until(at.Add(l.every))):
				}
			}
		}()
	}
	go func() { wg.Wait(); close(pr.done) }()
	return pr
}

// once sends one request of a load: its HTTP status, and an error for a
// transport error or a stream that ended without [DONE].
func (env *world) once(ctx context.Context, prompt string, tokens int, stream bool) (int, error) {
	if !stream {
		return env.complete(ctx, prompt, tokens, "")
	}
	r := env.stream(ctx, prompt, tokens, "", nil)
	if r.err == nil && r.status == http.StatusOK && !r.done {
		r.err = fmt.Errorf("stream ended without [DONE] after %d chunks", r.chunks)
	}
	return r.status, r.err
}

func (pr *prober) stop() []probe {
	pr.cancel()
	<-pr.done
	return pr.snapshot()
}

func (pr *prober) snapshot() []probe {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return append([]probe(nil), pr.probes...)
}

// failures counts failed probes sent at or after from (zero time: all).
func failures(ps []probe, from time.Time) (failed, total int) {
	for _, p := range ps {
		if p.at.Before(from) {
			continue
		}
		total++
		if !p.ok() {
			failed++
		}
	}
	return failed, total
}
