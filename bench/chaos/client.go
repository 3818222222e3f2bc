package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/omnious/provider-node/bench/internal/launch"
	"github.com/omnious/provider-node/bench/internal/loopback"
	"github.com/omnious/provider-node/bench/internal/promtext"
	"github.com/omnious/provider-node/engines/openai"
	"github.com/omnious/provider-node/extproc/testgw"
)

// promptOf is a prompt of about words stand-in tokens, distinct per tag.
func promptOf(tag string, words int) string {
	var b strings.Builder
	for i := 0; i < words; i++ {
		fmt.Fprintf(&b, "%s-w%d ", tag, i%7)
	}
	return b.String()
}

// complete sends one non-streamed completion through the gateway, pinned
// to addr when it is not empty (the gateway's subset hint). It returns the
// HTTP status; err is a transport error.
func (env *world) complete(ctx context.Context, prompt string, maxTokens int, addr string) (int, error) {
	resp, err := env.send(ctx, prompt, maxTokens, addr, false)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

// completion is the body of a completion of maxTokens (exactly:
// ignore_eos).
func completion(prompt string, maxTokens int, stream bool) []byte {
	body := map[string]any{"model": model, "prompt": prompt, "max_tokens": maxTokens, "ignore_eos": true}
	if stream {
		body["stream"] = true
	}
	b, _ := json.Marshal(body)
	return b
}

// send posts a completion through the gateway, pinned to addr when it is
// not empty.
func (env *world) send(ctx context.Context, prompt string, maxTokens int, addr string, stream bool) (*http.Response, error) {
	return env.sendTo(ctx, env.gw.URL(), bytes.NewReader(completion(prompt, maxTokens, stream)), addr, "")
}

// sendTo posts body to /v1/completions of the gateway at base, pinned to
// addr and tagged (testgw.HeaderTag) with tag when they are not empty.
func (env *world) sendTo(ctx context.Context, base string, body io.Reader, addr, tag string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if addr != "" {
		req.Header.Set(testgw.HeaderSubsetHint, addr)
	}
	if tag != "" {
		req.Header.Set(testgw.HeaderTag, tag)
	}
	return env.http.Do(req)
}

// streamResult is how a streamed completion ended for the client.
type streamResult struct {
	status int
	chunks int
	done   bool // saw data: [DONE]
	err    error
	ended  time.Time
}

// stream sends a streamed completion pinned to addr; first is closed once
// the first content chunk arrived.
func (env *world) stream(ctx context.Context, prompt string, maxTokens int, addr string, first chan<- struct{}) streamResult {
	resp, err := env.send(ctx, prompt, maxTokens, addr, true)
	if err != nil {
		return streamResult{err: err, ended: time.Now()}
	}
	defer resp.Body.Close()
	r := streamResult{status: resp.StatusCode}
	for ev, err := range openai.Events(resp.Body, 1<<20) {
		if err != nil {
			r.err = err
			break
		}
		if ev.Done {
			r.done = true
			continue
		}
		r.chunks++
		if r.chunks == 1 && first != nil {
			close(first)
		}
	}
	r.ended = time.Now()
	return r
}

func (env *world) post(ctx context.Context, url, body string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := env.http.Do(req)
	if err != nil {
		return fmt.Errorf("POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: status %d: %s", url, resp.StatusCode, bytes.TrimSpace(b))
	}
	return nil
}

func (env *world) getJSON(ctx context.Context, url string, v any) error {
	return loopback.GetJSON(ctx, env.http, url, v)
}

// indexBlocks is what the EPP's admin view says the index holds for addr.
func (env *world) indexBlocks(ctx context.Context, addr string) (int, error) {
	return indexBlocksOf(ctx, env.epp, addr)
}

func indexBlocksOf(ctx context.Context, e *launch.EPP, addr string) (int, error) {
	blocks, err := e.ResidentBlocks(ctx)
	if err != nil {
		return 0, err
	}
	n, ok := blocks[addr]
	if !ok {
		return 0, fmt.Errorf("the EPP does not list %s", addr)
	}
	return n, nil
}

// indexSpread is the fewest and the most blocks any of the EPPs' indexes
// holds for addr.
func (env *world) indexSpread(ctx context.Context, addr string) (fewest, most int, err error) {
	for i, e := range env.epps {
		n, err := indexBlocksOf(ctx, e, addr)
		if err != nil {
			return 0, 0, err
		}
		if i == 0 || n < fewest {
			fewest = n
		}
		most = max(most, n)
	}
	return fewest, most, nil
}

// truthBlocks is how many GPU blocks the engine holds (GET /admin/blocks).
func (env *world) truthBlocks(ctx context.Context, p *launch.Sim) (int, error) {
	var view struct {
		Blocks []struct {
			Medium string `json:"medium"`
		} `json:"blocks"`
	}
	if err := env.getJSON(ctx, p.URL()+"/admin/blocks", &view); err != nil {
		return 0, err
	}
	n := 0
	for _, b := range view.Blocks {
		if b.Medium == "" || b.Medium == "GPU" {
			n++
		}
	}
	return n, nil
}

// agrees reports whether the index holds exactly the engine's blocks for p
// (counts; the ingest tests pin the block-by-block agreement).
func (env *world) agrees(ctx context.Context, p *launch.Sim) (bool, int, int, error) {
	ix, err := env.indexBlocks(ctx, p.Addr())
	if err != nil {
		return false, 0, 0, err
	}
	tr, err := env.truthBlocks(ctx, p)
	if err != nil {
		return false, ix, 0, err
	}
	return ix == tr, ix, tr, nil
}

// metric returns the EPP's current value of the series name whose labels
// include want, read from its /metrics as Prometheus would; ok is false
// when there is none or the EPP does not answer.
func (env *world) metric(name string, want map[string]string) (float64, bool) {
	return metricOf(env.epp, name, want)
}

func metricOf(e *launch.EPP, name string, want map[string]string) (float64, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	page, err := e.Metrics(ctx)
	if err != nil {
		return 0, false
	}
	v, ok, err := promtext.SumWhere(page, name, want)
	return v, ok && err == nil
}

// breaker is the EPP's breaker state for addr (0 closed, 1 open, 2 half-open).
func (env *world) breaker(addr string) int {
	v, _ := env.metric("omnious_epp_breaker_state", map[string]string{"endpoint": addr})
	return int(v)
}

func (env *world) stale(addr string) bool {
	v, _ := env.metric("omnious_epp_replica_stale", map[string]string{"endpoint": addr})
	return v == 1
}

func (env *world) seqEvents(addr, event string) float64 {
	v, _ := env.metric("omnious_epp_kv_sequence_total", map[string]string{"replica": addr, "event": event})
	return v
}
