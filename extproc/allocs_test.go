package extproc

import (
	"context"
	"io"
	"runtime"
	"strconv"
	"testing"
	"unsafe"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/rules"
	"github.com/omnious/provider-node/scheduler"
)

// The allocation savings the server's comments claim, each held to a
// number. They skip under the race detector, which allocates on its own;
// the Makefile's unit target runs them without it (-run Allocs).

// allocsPerRun is testing.AllocsPerRun of f, with the bytes f allocated
// per run beside it.
func allocsPerRun(t *testing.T, runs int, f func()) (allocs, bytes float64) {
	t.Helper()
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race; run without it (make unit does: go test -run Allocs ./extproc/)")
	}
	// AllocsPerRun rounds a pool's refill away, but the bytes show it: the
	// pools are filled first, at the GOMAXPROCS AllocsPerRun sets (a
	// sync.Pool drops its contents when that changes), after a collection.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	runtime.GC()
	f()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	allocs = testing.AllocsPerRun(runs, f) // f runs once more to warm up
	runtime.ReadMemStats(&after)
	return allocs, float64(after.TotalAlloc-before.TotalAlloc) / float64(runs+1)
}

// ctxStream is the part of a gRPC stream that Server.watch reads.
type ctxStream struct {
	grpc.BidiStreamingServer[extprocv3.ProcessingRequest, extprocv3.ProcessingResponse]
}

func (ctxStream) Context() context.Context { return context.Background() }

// TestAllocsStreamState: a stream's state comes from the server's pool, so
// a stream allocates none of its few kilobytes (Server.watch, recycle).
func TestAllocsStreamState(t *testing.T) {
	s := NewServer(Config{}, onePicker{}, nil, nil, zap.NewNop())
	srv := &ctxStream{}
	allocs, _ := allocsPerRun(t, 100, func() { s.recycle(s.watch(srv)) })
	require.Zero(t, allocs)
}

// TestAllocsRequest: a whole request, handled as Process's receive loop
// handles it but without gRPC, allocates no body-sized buffer: a body in
// one message is used in place, a chunked one is gathered in a pooled
// buffer sized from Content-Length (or grown, without it), a rewritten
// one is built in a pooled buffer, and the replies are built in the
// recycled stream state. The counts are those measured when the test was
// written (go test -run Allocs -v ./extproc/: 6, 7, 8 and 17 allocations,
// 384 to 877 bytes for a 200 KiB body); the byte bounds are below the
// stream state's size, let alone the body's.
func TestAllocsRequest(t *testing.T) {
	const size = 200 << 10
	tests := []struct {
		name      string
		chunk     int  // request body message size; 0: one message
		noLength  bool // no Content-Length header
		rewrite   bool
		maxAllocs float64
		maxBytes  float64
	}{
		{name: "one message", maxAllocs: 6, maxBytes: 1024},
		{name: "chunked", chunk: 64 << 10, maxAllocs: 7, maxBytes: 1024},
		{name: "chunked, no content-length", chunk: 64 << 10, noLength: true, maxAllocs: 8, maxBytes: 1024},
		{name: "rewritten", chunk: 64 << 10, rewrite: true, maxAllocs: 17, maxBytes: 2048},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := chatRequestUsage(size, !tt.rewrite)
			s := NewServer(Config{}, onePicker{[]*endpoint.Endpoint{{Addr: "127.0.0.1:8000"}}}, nil, nil, zap.NewNop())
			kv := []string{":method", "POST", ":path", "/v1/chat/completions"}
			if !tt.noLength {
				kv = append(kv, "content-length", strconv.Itoa(len(body)))
			}
			if tt.rewrite {
				kv = append(kv, HeaderModelRewrite, "other-model")
			}
			msgs := []*extprocv3.ProcessingRequest{reqHeaders(false, kv...)}
			if tt.chunk == 0 {
				msgs = append(msgs, reqBody(string(body), true))
			}
			for off := 0; tt.chunk > 0 && off < len(body); off += tt.chunk {
				end := min(off+tt.chunk, len(body))
				msgs = append(msgs, reqBody(string(body[off:end]), end == len(body)))
			}
			msgs = append(msgs, okHeaders("application/json"), respBody(jsonResp, true))
			sent := 0
			send := func(r *extprocv3.ProcessingResponse) error {
				sent += len(r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody())
				return nil
			}
			srv := &ctxStream{}
			allocs, bytes := allocsPerRun(t, 20, func() {
				w := s.watch(srv)
				w.st.send = send
				for _, m := range msgs {
					if done, err := w.st.step(m, nil); done {
						t.Fatal(err)
					}
				}
				if done, err := w.st.step(nil, io.EOF); !done || err != nil {
					t.Fatal(done, err)
				}
				s.recycle(w)
			})
			require.GreaterOrEqual(t, sent, 22*(len(body)-len("other-model")), "the body went back to Envoy")
			t.Logf("%.0f allocations, %.0f bytes per request of %d", allocs, bytes, len(body))
			require.LessOrEqual(t, allocs, tt.maxAllocs)
			require.LessOrEqual(t, bytes, tt.maxBytes)
		})
	}
}

// TestAllocsPromptTokens: a precise request's prompt tokens go into a
// buffer the server recycles (Server.prompt), and its stand-in chat is
// rendered into one the prompter recycles (TokenPrompter.textBuf), so
// routing a 200 KiB chat allocates neither a buffer of its ~50k tokens (4
// bytes each, about 270 KiB) nor one of its ~210 KiB of text, only a few
// KiB (without the token pool the same request allocates about 1.4 times
// its body: go test -run AllocsPromptTokens -v ./extproc/).
func TestAllocsPromptTokens(t *testing.T) {
	body := chatRequestUsage(200<<10, true)
	msgs := []*extprocv3.ProcessingRequest{
		reqHeaders(false, ":method", "POST", ":path", "/v1/chat/completions", "content-length", strconv.Itoa(len(body))),
		reqBody(string(body), true),
	}
	for _, pooled := range []bool{true, false} {
		s := NewServer(Config{}, onePicker{[]*endpoint.Endpoint{{Addr: "127.0.0.1:8000"}}}, NewStandInPrompter(), nil, zap.NewNop())
		if !pooled {
			s.appender = nil
		}
		srv := &ctxStream{}
		_, bytes := allocsPerRun(t, 20, func() {
			w := s.watch(srv)
			w.st.send = func(*extprocv3.ProcessingResponse) error { return nil }
			for _, m := range msgs {
				if done, err := w.st.step(m, nil); done {
					t.Fatal(err)
				}
			}
			w.st.step(nil, io.EOF)
			s.recycle(w)
		})
		require.Positive(t, testutil.ToFloat64(s.promptModes["precise"]), "routed in precise mode")
		t.Logf("pooled %v: %.0f bytes per request of %d", pooled, bytes, len(body))
		if pooled {
			require.Less(t, bytes, 0.1*float64(len(body)))
		}
	}
}

// TestAllocsReplies: the routing reply (routeReply, encoded into its own
// array, a replaced BUFFERED body left a message field) and the body
// chunks (chunkReply) are built in place.
func TestAllocsReplies(t *testing.T) {
	var r routeReply
	dest, strip := "127.0.0.1:8000", []string{HeaderModelRewrite}
	routed := func() {
		r.n = 0
		r.add(HeaderDestination, stringBytes(dest))
		r.add(headerContentLen, strconv.AppendInt(r.contentLength[:0], 1024, 10))
	}
	var c chunkReply
	body := make([]byte, 200<<10)
	replaced := &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: body}}
	st := &stream{s: NewServer(Config{}, onePicker{}, nil, nil, zap.NewNop()),
		send: func(*extprocv3.ProcessingResponse) error { return nil }}
	for _, tt := range []struct {
		name string
		f    func()
	}{
		{"headers", func() { routed(); _ = r.onHeaders(strip, dest) }},
		{"buffered body", func() { routed(); _ = r.onRequestBody(strip, dest, nil) }},
		{"buffered body, replaced", func() { routed(); _ = r.onRequestBody(strip, dest, replaced) }},
		{"chunk", func() { _ = c.message(body, true, true) }},
		{"body in chunks", func() { _ = st.sendBody(body, true, false) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			allocs, _ := allocsPerRun(t, 100, tt.f)
			require.Zero(t, allocs)
		})
	}
}

// TestAllocsViews: header values are read, and the reply's values set,
// as views of the bytes they come from, without a copy.
func TestAllocsViews(t *testing.T) {
	h := &corev3.HeaderValue{Key: ":path", RawValue: []byte("/v1/chat/completions")}
	var v string
	var b []byte
	allocs, _ := allocsPerRun(t, 100, func() {
		v = headerValue(h)
		b = stringBytes(v)
	})
	require.Zero(t, allocs)
	require.Equal(t, unsafe.SliceData(h.RawValue), unsafe.StringData(v))
	require.Equal(t, unsafe.SliceData(h.RawValue), unsafe.SliceData(b))
}

// TestAllocsBodyPool: a recycled body buffer costs the pool's slice
// header, not the buffer.
func TestAllocsBodyPool(t *testing.T) {
	var p bodyPool
	for _, n := range []int{1, 64 << 10, 200 << 10, 4 << 20} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			allocs, bytes := allocsPerRun(t, 100, func() { p.put(p.get(n)) })
			require.LessOrEqual(t, allocs, 1.0)
			require.Less(t, bytes, 64.0)
		})
	}
}

// TestAllocsParse: the body scanner records spans without allocating;
// only the model name (and user, cache_salt) are decoded to strings.
func TestAllocsParse(t *testing.T) {
	body := chatRequest(200 << 10)
	var rb requestBody
	allocs, bytes := allocsPerRun(t, 20, func() {
		if err := parseRequestBody(body, &rb); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("%.0f allocations, %.0f bytes", allocs, bytes)
	require.LessOrEqual(t, allocs, 1.0)
	allocs, _ = allocsPerRun(t, 20, func() {
		it, err := newObjIter(body, 0, 1)
		for ok := err == nil; ok; {
			_, _, _, ok, err = it.next()
		}
		if err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs)
}

// TestAllocsResponse: SSE events the EPP has nothing to change in are
// forwarded as received, neither copied nor rewritten.
func TestAllocsResponse(t *testing.T) {
	events := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"model\":\"m1\"}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}],\"model\":\"m1\"}\n\n")
	r := &respState{sse: true}
	var out []byte
	allocs, _ := allocsPerRun(t, 100, func() { out = r.sseChunk(events, false) })
	require.Zero(t, allocs)
	require.Equal(t, unsafe.SliceData(events), unsafe.SliceData(out))
}

// TestAllocsSeries: a routed request's metric children are looked up in
// one map read, not resolved from their label values.
func TestAllocsSeries(t *testing.T) {
	s := NewServer(Config{}, onePicker{}, nil, prometheus.NewRegistry(), zap.NewNop())
	want := s.seriesOf("m1", "m2")
	allocs, _ := allocsPerRun(t, 100, func() {
		if s.seriesOf("m1", "m2") != want {
			t.Fatal("another series")
		}
	})
	require.Zero(t, allocs)
}

// TestAllocsApplyRules: the model rules' share of a request allocates
// nothing in any case (README, BenchmarkApplyRules): no rules, none
// matching, an objective and a weighted rewrite, an alias and a fallback.
func TestAllocsApplyRules(t *testing.T) {
	spec := &rules.Spec{
		Objectives: []rules.Objective{{Name: "batch", Priority: p32(100)}},
		Rewrites: []rules.Rewrite{{Name: "canary", Rules: []rules.Rule{{
			Matches: []rules.Match{{Model: &rules.ModelMatch{Value: "m1"}}},
			Targets: []rules.Target{{ModelRewrite: "m1-canary", Weight: p32(10)}, {ModelRewrite: "m1", Weight: p32(90)}},
		}}}},
		Models: []rules.Model{{Name: "big", Aliases: []string{"b"}, Fallbacks: []string{"small"}}},
	}
	sched, err := scheduler.New(must(scheduler.ParseConfig(nil)), nil, prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	sched.SetEndpoints([]scheduler.Target{{Endpoint: endpoint.Endpoint{Addr: smallAddr, Model: "small"}}})
	for _, tt := range []struct {
		name, band, model, fallback string
		rules                       bool
	}{
		{"no rules", "", "m2", "", false},
		{"no rule matches", "", "m2", "", true},
		{"objective and weighted rewrite", "batch", "m1", "", true},
		{"alias, fallback", "", "b", ReasonFallbackNoEndpoint, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := NewServer(Config{}, sched, nil, prometheus.NewRegistry(), zap.NewNop())
			if tt.rules {
				s.SetRules(ruleStore(t, spec), sched)
			}
			st := &stream{s: s}
			allocs, _ := allocsPerRun(t, 100, func() {
				st.band, st.clientModel, st.targetModel, st.fallback = tt.band, tt.model, tt.model, ""
				st.applyRules()
			})
			require.Equal(t, tt.fallback, st.fallback)
			require.Zero(t, allocs)
		})
	}
}

// TestAllocsCodec: a body-sized message is marshalled into a buffer of
// the pool's, not a fresh one (Codec).
func TestAllocsCodec(t *testing.T) {
	c := NewCodec(NewBufferPool())
	var r chunkReply
	msg := r.message(make([]byte, 200<<10), true, true)
	allocs, bytes := allocsPerRun(t, 50, func() {
		bs, err := c.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		bs.Free()
	})
	t.Logf("%.0f allocations, %.0f bytes", allocs, bytes) // 1 and 16 when written
	require.LessOrEqual(t, allocs, 1.0)
	require.Less(t, bytes, 1024.0)
}

// TestAllocsDecodeMessages: a chat's messages are decoded with their
// contents left as spans of the body, into a slice sized for eight (the
// slice and the role strings: 5 allocations, 1,104 bytes when written).
func TestAllocsDecodeMessages(t *testing.T) {
	body := chatRequest(200 << 10)
	var rb requestBody
	require.NoError(t, parseRequestBody(body, &rb))
	raw := rb.messages.of(body)
	allocs, bytes := allocsPerRun(t, 20, func() {
		if _, err := decodeMessages(raw); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("%.0f allocations, %.0f bytes", allocs, bytes)
	require.LessOrEqual(t, allocs, 5.0)
	require.Less(t, bytes, 2048.0)
}
