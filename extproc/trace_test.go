package extproc

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/zap"
)

// TestTracing drives requests through a tracing server: the routing reply
// carries the EPP span's context to the engine, the span is a child of the
// client's, and it ends with the request's outcome.
func TestTracing(t *testing.T) {
	const (
		clientTrace = "0af7651916cd43dd8448eb211c80319c"
		clientSpan  = "b7ad6b7169203331"
	)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	p := &fakePicker{addrs: []string{ep1}}
	s := NewServer(Config{}, p, nil, nil, zap.NewNop())
	s.SetTracerProvider(tp)
	c := serve(t, Config{}, s)

	// reply runs a chat request through routing and returns the headers the
	// routing reply sets.
	reply := func(t *testing.T, kv ...string) map[string]string {
		ctx := t.Context()
		st, err := c.Process(ctx)
		require.NoError(t, err)
		require.NoError(t, st.Send(chatHeaders(kv...)))
		require.NoError(t, st.Send(reqBody(chatBody, true)))
		r, err := st.Recv()
		require.NoError(t, err)
		set := map[string]string{}
		for _, h := range r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
			set[h.Header.Key] = string(h.Header.RawValue)
		}
		_, err = st.Recv() // the body
		require.NoError(t, err)
		require.NoError(t, st.Send(okHeaders("application/json")))
		_, err = st.Recv()
		require.NoError(t, err)
		require.NoError(t, st.Send(respBody(jsonResp, true)))
		_, err = st.Recv()
		require.NoError(t, err)
		require.NoError(t, st.CloseSend())
		_, err = st.Recv()
		require.Error(t, err) // EOF: the stream is over
		return set
	}
	// The span ends when the server sees the stream close, just after the
	// client does.
	seen := 0
	lastSpan := func(t *testing.T) sdktrace.ReadOnlySpan {
		require.Eventually(t, func() bool { return len(rec.Ended()) > seen }, 5*time.Second, time.Millisecond)
		spans := rec.Ended()
		seen = len(spans)
		return spans[len(spans)-1]
	}
	attrs := func(sp sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
		m := map[attribute.Key]attribute.Value{}
		for _, kv := range sp.Attributes() {
			m[kv.Key] = kv.Value
		}
		return m
	}

	t.Run("child of the client's trace, carried upstream", func(t *testing.T) {
		set := reply(t, "traceparent", "00-"+clientTrace+"-"+clientSpan+"-01", "tracestate", "vendor=x")
		sp := lastSpan(t)
		require.Equal(t, "epp.request", sp.Name())
		require.Equal(t, clientTrace, sp.SpanContext().TraceID().String())
		require.Equal(t, clientSpan, sp.Parent().SpanID().String())
		require.True(t, sp.Parent().IsRemote())
		require.Equal(t, "00-"+clientTrace+"-"+sp.SpanContext().SpanID().String()+"-01", set["traceparent"])
		require.Equal(t, "vendor=x", set["tracestate"])
		a := attrs(sp)
		require.Equal(t, "m1", a["gen_ai.request.model"].AsString())
		require.Equal(t, ep1, a["omnious.epp.destination"].AsString())
		require.Equal(t, ep1, a["omnious.epp.served"].AsString())
		require.Equal(t, int64(200), a["http.response.status_code"].AsInt64())
		require.Equal(t, int64(5), a["gen_ai.usage.input_tokens"].AsInt64())
		require.Equal(t, int64(3), a["gen_ai.usage.output_tokens"].AsInt64())
		require.Equal(t, "completed", a["omnious.epp.end"].AsString())
		require.Equal(t, codes.Unset, sp.Status().Code)
		require.Len(t, sp.Events(), 1)
		require.Equal(t, "routed", sp.Events()[0].Name)
	})
	t.Run("no client trace: a new root, still carried upstream", func(t *testing.T) {
		set := reply(t)
		sp := lastSpan(t)
		require.False(t, sp.Parent().IsValid())
		require.Equal(t, "00-"+sp.SpanContext().TraceID().String()+"-"+sp.SpanContext().SpanID().String()+"-01", set["traceparent"])
		require.NotContains(t, set, "tracestate")
	})
	t.Run("a rejected request ends its span with the error", func(t *testing.T) {
		st, err := c.Process(t.Context())
		require.NoError(t, err)
		require.NoError(t, st.Send(chatHeaders()))
		require.NoError(t, st.Send(reqBody(`{"messages":[]}`, true)))
		r, err := st.Recv()
		require.NoError(t, err)
		require.Equal(t, int32(400), int32(r.GetImmediateResponse().GetStatus().GetCode()))
		require.NoError(t, st.CloseSend())
		_, err = st.Recv()
		require.Error(t, err)
		sp := lastSpan(t)
		require.Equal(t, codes.Error, sp.Status().Code)
		require.Equal(t, "rejected "+strconv.Itoa(400)+": bad_request", sp.Status().Description)
	})
}

// TestRequestIDGenerated: a request without x-request-id gets the EPP's
// id, the one the scheduler and the logs use, and it goes upstream.
func TestRequestIDGenerated(t *testing.T) {
	p := &fakePicker{addrs: []string{ep1}}
	c := startServer(t, Config{}, p, nil, nil)
	st, err := c.Process(t.Context())
	require.NoError(t, err)
	require.NoError(t, st.Send(rawReqHeaders(true, ":method", "GET", ":path", "/v1/models")))
	r, err := st.Recv()
	require.NoError(t, err)
	reqs, _ := p.snapshot()
	require.Len(t, reqs, 1)
	require.NotEmpty(t, reqs[0].ID)
	var got string
	for _, h := range r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.Header.Key == headerRequestID {
			got = string(h.Header.RawValue)
		}
	}
	require.Equal(t, reqs[0].ID, got)
}
