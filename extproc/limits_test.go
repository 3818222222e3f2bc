package extproc

import (
	"context"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
)

// TestIdleTimeouts: a stream whose proxy goes quiet is closed after the
// idle timeout of its phase; with the timeouts disabled it waits.
func TestIdleTimeouts(t *testing.T) {
	const idle = 150 * time.Millisecond
	half := chatBody[:len(chatBody)/2]
	cases := []struct {
		name      string
		reqIdle   time.Duration
		respIdle  time.Duration
		send      []*extprocv3.ProcessingRequest
		replies   int // routing replies expected before the quiet spell
		want      *extprocv3.ProcessingResponse
		wantCode  codes.Code // when no immediate response is expected
		wantDone  bool       // the scheduler hears of a failed request
		stillOpen bool       // timeouts disabled: the stream still serves
	}{
		{name: "nothing at all", reqIdle: idle, respIdle: time.Hour,
			want: expImmediate(408, "request_timeout", "no request data from the client for 150ms")},
		{name: "headers then nothing", reqIdle: idle, respIdle: time.Hour,
			send: []*extprocv3.ProcessingRequest{chatHeaders()},
			want: expImmediate(408, "request_timeout", "no request data from the client for 150ms")},
		{name: "half a body then nothing", reqIdle: idle, respIdle: time.Hour,
			send: []*extprocv3.ProcessingRequest{chatHeaders(), reqBody(half, false)},
			want: expImmediate(408, "request_timeout", "no request data from the client for 150ms")},
		{name: "routed, then no response", reqIdle: time.Hour, respIdle: idle,
			send:    []*extprocv3.ProcessingRequest{chatHeaders(), reqBody(chatBody, true)},
			replies: 2, wantCode: codes.DeadlineExceeded, wantDone: true},
		{name: "disabled: headers then a late body is routed", reqIdle: -1, respIdle: -1,
			send: []*extprocv3.ProcessingRequest{chatHeaders()}, stillOpen: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := &fakePicker{addrs: []string{ep1}}
			c := startServer(t, Config{RequestIdleTimeout: tc.reqIdle, ResponseIdleTimeout: tc.respIdle}, p, nil, nil)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			st, err := c.Process(ctx)
			require.NoError(t, err)
			start := time.Now()
			for _, m := range tc.send {
				require.NoError(t, st.Send(m))
			}
			for i := 0; i < tc.replies; i++ {
				_, err := st.Recv()
				require.NoError(t, err)
			}
			if tc.stillOpen {
				time.Sleep(3 * idle)
				require.NoError(t, st.Send(reqBody(chatBody, true)))
				got, err := st.Recv()
				require.NoError(t, err)
				require.True(t, proto.Equal(expRouted(ep1, strconv.Itoa(len(chatBody))), got), prototext.Format(got))
				return
			}
			got, err := st.Recv()
			if tc.want != nil {
				require.NoError(t, err)
				require.True(t, proto.Equal(tc.want, got), prototext.Format(got))
				_, err = st.Recv()
				require.Error(t, err, "the stream ends after the 408")
			} else {
				require.Error(t, err)
				require.Equal(t, tc.wantCode, status.Code(err), err.Error())
			}
			require.GreaterOrEqual(t, time.Since(start), idle, "closed before the idle timeout")
			_, done := p.snapshot()
			if tc.wantDone {
				require.Eventually(t, func() bool { _, done = p.snapshot(); return len(done) == 1 }, 5*time.Second, 5*time.Millisecond)
				require.ErrorIs(t, done[0].Err, errStreamEnded)
			} else {
				require.Empty(t, done)
			}
		})
	}
}

// TestGRPCMessageLimits: a message over the receive limit fails its own
// stream with ResourceExhausted; the server keeps serving other streams.
func TestGRPCMessageLimits(t *testing.T) {
	const limit = 64 << 10
	p := &fakePicker{addrs: []string{ep1}}
	c := startServer(t, Config{MaxBodyBytes: 48 << 10, MaxRecvMsgSize: limit}, p, nil, nil)
	bigBody := func(n int) string {
		return `{"model":"m1","messages":[{"role":"user","content":"` + strings.Repeat("a", n) + `"}]}`
	}
	cases := []struct {
		name     string
		msgs     []*extprocv3.ProcessingRequest
		wantCode codes.Code
		want     *extprocv3.ProcessingResponse
	}{
		{name: "body message over the gRPC limit",
			msgs:     []*extprocv3.ProcessingRequest{chatHeaders(), reqBody(bigBody(limit+1024), true)},
			wantCode: codes.ResourceExhausted},
		{name: "headers message over the gRPC limit",
			msgs:     []*extprocv3.ProcessingRequest{chatHeaders("x-huge", strings.Repeat("h", limit+1024))},
			wantCode: codes.ResourceExhausted},
		{name: "under the gRPC limit but over the body limit",
			msgs: []*extprocv3.ProcessingRequest{chatHeaders(), reqBody(bigBody(50<<10), true)},
			want: expImmediate(413, "body_too_large", "request body exceeds the limit of 49152 bytes")},
		{name: "under both limits is routed",
			msgs: []*extprocv3.ProcessingRequest{chatHeaders(), reqBody(bigBody(40<<10), true)},
			want: expRouted(ep1, strconv.Itoa(len(bigBody(40<<10))))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := c.Process(ctx)
			require.NoError(t, err)
			for _, m := range tc.msgs {
				if err := st.Send(m); err != nil {
					break // the server may already have failed the stream
				}
			}
			got, err := st.Recv()
			if tc.want != nil {
				require.NoError(t, err)
				require.True(t, proto.Equal(tc.want, got), prototext.Format(got))
				return
			}
			require.Error(t, err)
			require.Equal(t, tc.wantCode, status.Code(err), err.Error())
		})
	}
	// The server still serves a normal request after every refusal.
	require.NoError(t, runSteps(t, c, []step{
		{chatHeaders(), nil},
		{reqBody(chatBody, true), []*extprocv3.ProcessingResponse{expRouted(ep1, strconv.Itoa(len(chatBody))), expReqBody(chatBody, true)}},
		{okHeaders("application/json"), []*extprocv3.ProcessingResponse{expRespHeaders(false)}},
		{respBody(jsonResp, true), []*extprocv3.ProcessingResponse{expRespBody(jsonResp, true)}},
	}))
}

// TestStreamsLeaveNoGoroutines ends streams every way a stream ends
// (completed, client gone mid-request, idle in either phase, immediate
// error) and requires the server's goroutines to be gone afterwards: each
// stream has a receive loop and a timer of its own.
func TestStreamsLeaveNoGoroutines(t *testing.T) {
	p := &fakePicker{addrs: []string{ep1}}
	c := startServer(t, Config{RequestIdleTimeout: 50 * time.Millisecond, ResponseIdleTimeout: 80 * time.Millisecond}, p, nil, nil)
	// One stream first, so the connection's own goroutines are counted
	// in the baseline.
	require.NoError(t, runSteps(t, c, []step{{reqHeaders(true, ":method", "GET", ":path", "/v1/models"), []*extprocv3.ProcessingResponse{expRouted(ep1, "")}}}))
	time.Sleep(50 * time.Millisecond)
	base := runtime.NumGoroutine()
	for range 10 {
		// Completed.
		require.NoError(t, runSteps(t, c, []step{
			{chatHeaders(), nil},
			{reqBody(chatBody, true), []*extprocv3.ProcessingResponse{expRouted(ep1, strconv.Itoa(len(chatBody))), expReqBody(chatBody, true)}},
			{okHeaders("application/json"), []*extprocv3.ProcessingResponse{expRespHeaders(false)}},
			{respBody(jsonResp, true), []*extprocv3.ProcessingResponse{expRespBody(jsonResp, true)}},
		}))
		// Bad request, answered at once.
		require.NoError(t, runSteps(t, c, []step{
			{chatHeaders(), nil},
			{reqBody(`{"model":`, true), []*extprocv3.ProcessingResponse{expImmediate(400, "bad_request", "invalid JSON body: unexpected end of JSON input")}},
		}))
		// Client gone after half a body, and streams left idle in the
		// request and in the response phase.
		for _, n := range []int{1, 2, 3} {
			ctx, cancel := context.WithCancel(context.Background())
			st, err := c.Process(ctx)
			require.NoError(t, err)
			require.NoError(t, st.Send(chatHeaders()))
			if n >= 2 {
				require.NoError(t, st.Send(reqBody(chatBody, n == 3)))
			}
			if n == 1 {
				cancel()
				continue
			}
			for {
				if _, err := st.Recv(); err != nil {
					break // 408 then EOF, or DeadlineExceeded after routing
				}
			}
			cancel()
		}
	}
	// Polled here: require.Eventually runs the check on a goroutine of
	// its own, which would be counted.
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base {
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
		t.Fatalf("%d goroutines left, %d before the streams", n, base)
	}
}
