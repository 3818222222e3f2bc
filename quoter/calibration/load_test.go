package calibration

import (
	"context"
	"net"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

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
