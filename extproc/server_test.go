package extproc

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/kvindex"
	"github.com/omnious/provider-node/scheduler"
)

const (
	msgs       = `"messages":[{"role":"user","content":"hi"}]`
	chatBody   = `{"model":"m1",` + msgs + `}`
	streamBody = `{"model":"m1","stream":true,` + msgs + `}`
	usageJSON  = `{"prompt_tokens":5,"total_tokens":8,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":2}}`
	jsonResp   = `{"id":"r","object":"chat.completion","model":"m1","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":` + usageJSON + `}`
	ev1        = `data: {"id":"c","object":"chat.completion.chunk","model":"m1","choices":[{"index":0,"delta":{"content":"he"}}]}` + "\n\n"
	evUsage    = `data: {"id":"c","object":"chat.completion.chunk","model":"m1","choices":[],"usage":` + usageJSON + `}` + "\n\n"
	evDone     = "data: [DONE]\n\n"
	ep1, ep2   = "10.0.0.1:8000", "10.0.0.1:8001"
)

func chatHeaders(kv ...string) *extprocv3.ProcessingRequest {
	return reqHeaders(false, append([]string{":method", "POST", ":path", "/v1/chat/completions", "content-type", "application/json"}, kv...)...)
}

func okHeaders(ctype string) *extprocv3.ProcessingRequest {
	return withServed(respHeaders(false, ":status", "200", "content-type", ctype), ep1)
}

type wantDone struct {
	status, prompt, cached, completion int
	served                             string
	err                                bool
}

func TestProtocol(t *testing.T) {
	big := `{"model":"m1","prompt":"` + strings.Repeat("x", 130000) + `"}`
	rewritten := func(s string) string { return strings.Replace(s, `"model":"m1"`, `"model":"m1-lora"`, 1) }
	injected := `{"stream_options":{"include_usage":true},"model":"m1","stream":true,` + msgs + `}`
	asked := `{"model":"m1","stream":true,"stream_options":{"include_usage":true},` + msgs + `}`
	lora := rewritten(ev1)
	tests := []struct {
		name    string
		cfg     Config
		addrs   []string
		pickErr error
		steps   []step
		done    []wantDone
		check   func(t *testing.T, reqs []scheduler.Request)
		grpcErr codes.Code
	}{{
		name:  "json unchanged body, usage parsed, served endpoint",
		cfg:   Config{MaxEndpoints: new(0)},
		addrs: []string{ep1, ep2},
		steps: []step{
			{chatHeaders("content-length", strconv.Itoa(len(chatBody))), nil},
			{reqBody(chatBody[:10], false), nil},
			{reqBody(chatBody[10:], true), []*extprocv3.ProcessingResponse{expRouted(ep1+","+ep2, strconv.Itoa(len(chatBody))), expReqBody(chatBody, true)}},
			{okHeaders("application/json"), []*extprocv3.ProcessingResponse{expRespHeaders(false)}},
			{respBody(jsonResp[:20], false), nil},
			{respBody(jsonResp[20:], true), []*extprocv3.ProcessingResponse{expRespBody(jsonResp, true)}},
		},
		done: []wantDone{{status: 200, served: ep1, prompt: 5, cached: 2, completion: 3}},
		check: func(t *testing.T, reqs []scheduler.Request) {
			require.Len(t, reqs, 1)
			require.Equal(t, "m1", reqs[0].Model)
			require.Equal(t, `[{"role":"user","content":"hi"}]`, string(reqs[0].PromptText))
			require.Nil(t, reqs[0].Subset)
			require.Nil(t, reqs[0].Tokens)
		},
	}, {
		name:  "large body re-emitted in 62000-byte chunks",
		addrs: []string{ep1},
		steps: []step{
			{reqHeaders(false, ":method", "POST", ":path", "/v1/completions"), nil},
			{reqBody(big[:65536], false), nil},
			{reqBody(big[65536:], true), []*extprocv3.ProcessingResponse{expRouted(ep1, strconv.Itoa(len(big))),
				expReqBody(big[:62000], false), expReqBody(big[62000:124000], false), expReqBody(big[124000:], true)}},
			{okHeaders("application/json"), []*extprocv3.ProcessingResponse{expRespHeaders(false)}},
			{respBody(big, true), []*extprocv3.ProcessingResponse{expRespBody(big[:62000], false), expRespBody(big[62000:124000], false), expRespBody(big[124000:], true)}},
		},
		done: []wantDone{{status: 200, served: ep1}},
	}, {
		name:  "model rewrite both ways",
		addrs: []string{ep1},
		steps: []step{
			{chatHeaders("x-gateway-model-name-rewrite", "m1-lora"), nil},
			{reqBody(chatBody, true), []*extprocv3.ProcessingResponse{expRouted(ep1, strconv.Itoa(len(rewritten(chatBody))), HeaderModelRewrite), expReqBody(rewritten(chatBody), true)}},
			{okHeaders("application/json"), []*extprocv3.ProcessingResponse{expRespHeaders(true)}},
			{respBody(rewritten(jsonResp), true), []*extprocv3.ProcessingResponse{expRespBody(jsonResp, true)}},
		},
		done:  []wantDone{{status: 200, served: ep1, prompt: 5, cached: 2, completion: 3}},
		check: func(t *testing.T, reqs []scheduler.Request) { require.Equal(t, "m1-lora", reqs[0].Model) },
	}, {
		name:  "usage injected, usage event stripped, events split across chunks",
		addrs: []string{ep1},
		steps: []step{
			{chatHeaders(), nil},
			{reqBody(streamBody, true), []*extprocv3.ProcessingResponse{expRouted(ep1, strconv.Itoa(len(injected))), expReqBody(injected, true)}},
			{okHeaders("text/event-stream; charset=utf-8"), []*extprocv3.ProcessingResponse{expRespHeaders(true)}},
			{respBody(ev1[:30], false), nil},
			{respBody(ev1[30:]+ev1[:5], false), []*extprocv3.ProcessingResponse{expRespBody(ev1, false)}},
			{respBody(ev1[5:]+evUsage[:40], false), []*extprocv3.ProcessingResponse{expRespBody(ev1, false)}},
			{respBody(evUsage[40:]+evDone, false), []*extprocv3.ProcessingResponse{expRespBody(evDone, false)}},
			{respBody("", true), []*extprocv3.ProcessingResponse{expRespBody("", true)}},
		},
		done: []wantDone{{status: 200, served: ep1, prompt: 5, cached: 2, completion: 3}},
	}, {
		name:  "rewrite and injection together, usage event stripped, model mapped back",
		addrs: []string{ep1},
		steps: []step{
			{chatHeaders("x-gateway-model-name-rewrite", "m1-lora"), nil},
			{reqBody(streamBody, true), []*extprocv3.ProcessingResponse{expRouted(ep1, strconv.Itoa(len(rewritten(injected))), HeaderModelRewrite), expReqBody(rewritten(injected), true)}},
			{okHeaders("text/event-stream"), []*extprocv3.ProcessingResponse{expRespHeaders(true)}},
			{respBody(lora+lora+rewritten(evUsage)+evDone, true), []*extprocv3.ProcessingResponse{expRespBody(ev1+ev1+evDone, true)}},
		},
		done: []wantDone{{status: 200, served: ep1, prompt: 5, cached: 2, completion: 3}},
	}, {
		name:  "client asked for usage: nothing injected or stripped",
		addrs: []string{ep1},
		steps: []step{
			{chatHeaders(), nil},
			{reqBody(asked, true), []*extprocv3.ProcessingResponse{expRouted(ep1, strconv.Itoa(len(asked))), expReqBody(asked, true)}},
			{okHeaders("text/event-stream"), []*extprocv3.ProcessingResponse{expRespHeaders(false)}},
			{respBody(ev1+evUsage+evDone, true), []*extprocv3.ProcessingResponse{expRespBody(ev1+evUsage+evDone, true)}},
		},
		done: []wantDone{{status: 200, served: ep1, prompt: 5, cached: 2, completion: 3}},
	}, {
		name:  "injection disabled",
		cfg:   Config{InjectUsage: new(bool)},
		addrs: []string{ep1},
		steps: []step{
			{chatHeaders(), nil},
			{reqBody(streamBody, true), []*extprocv3.ProcessingResponse{expRouted(ep1, strconv.Itoa(len(streamBody))), expReqBody(streamBody, true)}},
			{okHeaders("text/event-stream"), []*extprocv3.ProcessingResponse{expRespHeaders(false)}},
			{respBody(ev1+evDone, true), []*extprocv3.ProcessingResponse{expRespBody(ev1+evDone, true)}},
		},
		done: []wantDone{{status: 200, served: ep1}},
	}, {
		name:  "subset hint passed exactly, max endpoints caps the list",
		cfg:   Config{MaxEndpoints: new(1)},
		addrs: []string{ep2, ep1},
		steps: []step{
			{withSubset(chatHeaders(), ep2), nil},
			{reqBody(chatBody, true), []*extprocv3.ProcessingResponse{expRouted(ep2, strconv.Itoa(len(chatBody))), expReqBody(chatBody, true)}},
		},
		done: []wantDone{{err: true}},
		check: func(t *testing.T, reqs []scheduler.Request) {
			require.Equal(t, []string{ep2}, reqs[0].Subset)
		},
	}, {
		name:  "empty subset hint is a non-nil empty subset",
		addrs: []string{ep1},
		steps: []step{
			{withSubset(chatHeaders()), nil},
			{reqBody(chatBody, true), []*extprocv3.ProcessingResponse{expRouted(ep1, strconv.Itoa(len(chatBody))), expReqBody(chatBody, true)}},
		},
		done: []wantDone{{err: true}},
		check: func(t *testing.T, reqs []scheduler.Request) {
			require.NotNil(t, reqs[0].Subset)
			require.Empty(t, reqs[0].Subset)
		},
	}, {
		name:  "GET /v1/models is routed on headers",
		addrs: []string{ep1},
		steps: []step{
			{reqHeaders(true, ":method", "GET", ":path", "/v1/models", "x-request-id", "abc"), []*extprocv3.ProcessingResponse{expRouted(ep1, "")}},
			{okHeaders("application/json"), []*extprocv3.ProcessingResponse{expRespHeaders(false)}},
			{respBody(`{"object":"list","data":[]}`, true), []*extprocv3.ProcessingResponse{expRespBody(`{"object":"list","data":[]}`, true)}},
		},
		done: []wantDone{{status: 200, served: ep1}},
		check: func(t *testing.T, reqs []scheduler.Request) {
			require.Equal(t, "abc", reqs[0].ID)
			require.Equal(t, "", reqs[0].Model)
		},
	}, {
		name:  "client copies of gateway-only headers are removed; trace context passes untouched without tracing",
		addrs: []string{ep1},
		steps: []step{
			{reqHeaders(true, ":method", "GET", ":path", "/v1/models", KeyServed, "10.9.9.9:1", "traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", KeySubset, "10.9.9.9:1"),
				[]*extprocv3.ProcessingResponse{expRouted(ep1, "", KeyServed, KeySubset)}},
			{okHeaders("application/json"), []*extprocv3.ProcessingResponse{expRespHeaders(false)}},
			{respBody(`{}`, true), []*extprocv3.ProcessingResponse{expRespBody(`{}`, true)}},
		},
		done: []wantDone{{status: 200, served: ep1}},
		check: func(t *testing.T, reqs []scheduler.Request) {
			require.Nil(t, reqs[0].Subset, "a header is not the gateway's subset hint")
		},
	}, {
		name:  "headers, band, tenant and session reach the scheduler",
		addrs: []string{ep1},
		steps: []step{
			{chatHeaders("x-gateway-inference-objective", "gold", "x-gateway-inference-fairness-id", "t1", "x-session-id", "s1"), nil},
			{reqBody(`{"model":"m1","user":"u","cache_salt":"salt",`+msgs+`}`, true), []*extprocv3.ProcessingResponse{
				expRouted(ep1, strconv.Itoa(len(`{"model":"m1","user":"u","cache_salt":"salt",`+msgs+`}`)),
					"x-gateway-inference-objective", "x-gateway-inference-fairness-id"), expReqBody(`{"model":"m1","user":"u","cache_salt":"salt",`+msgs+`}`, true)}},
			{okHeaders("application/json"), []*extprocv3.ProcessingResponse{expRespHeaders(false)}},
			{respBody(`{}`, false), nil},
			{respTrailers(), []*extprocv3.ProcessingResponse{expRespBody(`{}`, false), expRespTrailers()}},
		},
		done: []wantDone{{status: 200, served: ep1}},
		check: func(t *testing.T, reqs []scheduler.Request) {
			r := reqs[0]
			require.Equal(t, []string{"gold", "t1", "s1", "salt"}, []string{r.Band, r.Tenant, r.SessionKey, r.CacheSalt})
			require.False(t, r.Arrived.IsZero())
		},
	}, {
		name:  "calibration traffic counts under its reserved tenant, whatever tenant it claims",
		addrs: []string{ep1},
		steps: []step{
			{chatHeaders("x-gateway-inference-fairness-id", "t1", HeaderCalibration, "1"), nil},
			{reqBody(chatBody, true), []*extprocv3.ProcessingResponse{
				expRouted(ep1, strconv.Itoa(len(chatBody)), "x-gateway-inference-fairness-id", HeaderCalibration), expReqBody(chatBody, true)}},
			{okHeaders("application/json"), []*extprocv3.ProcessingResponse{expRespHeaders(false)}},
			{respBody(`{}`, true), []*extprocv3.ProcessingResponse{expRespBody(`{}`, true)}},
		},
		done: []wantDone{{status: 200, served: ep1}},
		check: func(t *testing.T, reqs []scheduler.Request) {
			require.Equal(t, scheduler.CalibrationTenant, reqs[0].Tenant)
		},
	}, {
		name:  "the calibration tenant cannot be claimed by name",
		addrs: []string{ep1},
		steps: []step{
			{chatHeaders("x-gateway-inference-fairness-id", scheduler.CalibrationTenant, HeaderCalibration, "yes"), nil},
			{reqBody(chatBody, true), []*extprocv3.ProcessingResponse{
				expRouted(ep1, strconv.Itoa(len(chatBody)), "x-gateway-inference-fairness-id", HeaderCalibration), expReqBody(chatBody, true)}},
			{okHeaders("application/json"), []*extprocv3.ProcessingResponse{expRespHeaders(false)}},
			{respBody(`{}`, true), []*extprocv3.ProcessingResponse{expRespBody(`{}`, true)}},
		},
		done: []wantDone{{status: 200, served: ep1}},
		check: func(t *testing.T, reqs []scheduler.Request) {
			require.Empty(t, reqs[0].Tenant)
		},
	}, {
		name:  "request trailers end the body",
		addrs: []string{ep1},
		steps: []step{
			{chatHeaders(), nil},
			{reqBody(chatBody, false), nil},
			{reqTrailers(), []*extprocv3.ProcessingResponse{expRouted(ep1, strconv.Itoa(len(chatBody))), expReqBody(chatBody, false), expReqTrailers()}},
			{okHeaders("application/json"), []*extprocv3.ProcessingResponse{expRespHeaders(false)}},
			{respBody(jsonResp, true), []*extprocv3.ProcessingResponse{expRespBody(jsonResp, true)}},
		},
		done: []wantDone{{status: 200, served: ep1, prompt: 5, cached: 2, completion: 3}},
	}, {
		name:  "upstream error status and headers-only response",
		addrs: []string{ep1},
		steps: []step{
			{chatHeaders(), nil},
			{reqBody(chatBody, true), []*extprocv3.ProcessingResponse{expRouted(ep1, strconv.Itoa(len(chatBody))), expReqBody(chatBody, true)}},
			{withServed(respHeaders(true, ":status", "503"), ep1), []*extprocv3.ProcessingResponse{expRespHeaders(false)}},
		},
		done: []wantDone{{status: 503, served: ep1}},
	}, {
		name:  "BUFFERED mode answers headers at once and routes in the body response",
		addrs: []string{ep1},
		steps: []step{
			{withProtocol(chatHeaders("x-gateway-model-name-rewrite", "m1-lora"), filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED), []*extprocv3.ProcessingResponse{expContinueHeaders()}},
			{reqBody(chatBody, true), []*extprocv3.ProcessingResponse{{
				DynamicMetadata: lbMetadata(ep1),
				Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
					ClearRouteCache: true,
					HeaderMutation:  expRouted(ep1, strconv.Itoa(len(rewritten(chatBody))), HeaderModelRewrite).GetRequestHeaders().Response.HeaderMutation,
					BodyMutation:    &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte(rewritten(chatBody))}},
				}}},
			}}},
			{okHeaders("application/json"), []*extprocv3.ProcessingResponse{expRespHeaders(true)}},
			{respBody(rewritten(jsonResp), true), []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ResponseBody{
				ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
					Mutation: &extprocv3.BodyMutation_Body{Body: []byte(jsonResp)}}}}}}}},
		},
		done: []wantDone{{status: 200, served: ep1, prompt: 5, cached: 2, completion: 3}},
	}, {
		name:  "BUFFERED mode unchanged body has no mutations",
		addrs: []string{ep1},
		cfg:   Config{DefaultBodyMode: ModeBuffered},
		steps: []step{
			{chatHeaders(), []*extprocv3.ProcessingResponse{expContinueHeaders()}},
			{reqBody(chatBody, true), []*extprocv3.ProcessingResponse{{
				DynamicMetadata: lbMetadata(ep1),
				Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
					ClearRouteCache: true, HeaderMutation: expRouted(ep1, "").GetRequestHeaders().Response.HeaderMutation}}},
			}}},
		},
		done: []wantDone{{err: true}},
	}, {
		name:  "response body mode NONE ends the request at the response headers",
		addrs: []string{ep1},
		steps: []step{
			{withProtocol(chatHeaders(), filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_NONE), nil},
			{reqBody(chatBody, true), []*extprocv3.ProcessingResponse{expRouted(ep1, strconv.Itoa(len(chatBody))), expReqBody(chatBody, true)}},
			{okHeaders("application/json"), []*extprocv3.ProcessingResponse{expRespHeaders(false)}},
			{respTrailers(), []*extprocv3.ProcessingResponse{expRespTrailers()}},
		},
		done: []wantDone{{status: 200, served: ep1}},
	}, {
		name:  "JSON response over the body limit passes through unbuffered",
		cfg:   Config{MaxBodyBytes: 100},
		addrs: []string{ep1},
		steps: []step{
			{reqHeaders(false, ":method", "POST", ":path", "/v1/embeddings"), nil},
			{reqBody(`{"model":"e"}`, true), []*extprocv3.ProcessingResponse{expRouted(ep1, strconv.Itoa(len(`{"model":"e"}`))), expReqBody(`{"model":"e"}`, true)}},
			{okHeaders("application/json"), []*extprocv3.ProcessingResponse{expRespHeaders(false)}},
			{respBody(jsonResp[:60], false), nil},
			{respBody(jsonResp[60:120], false), []*extprocv3.ProcessingResponse{expRespBody(jsonResp[:120], false)}},
			{respBody(jsonResp[120:], true), []*extprocv3.ProcessingResponse{expRespBody(jsonResp[120:], true)}},
		},
		done: []wantDone{{status: 200, served: ep1}},
	}, {
		name:  "bad JSON is 400",
		addrs: []string{ep1},
		steps: []step{
			{chatHeaders(), nil},
			{reqBody(`{"model":"m1",`, true), []*extprocv3.ProcessingResponse{expImmediate(400, "bad_request", "invalid JSON body: unexpected end of JSON input")}},
		},
	}, {
		name:  "no model is 400",
		addrs: []string{ep1},
		steps: []step{
			{chatHeaders(), nil},
			{reqBody(`{`+msgs+`}`, true), []*extprocv3.ProcessingResponse{expImmediate(400, "bad_request", "the request has no model")}},
		},
	}, {
		name:  "body over the limit by content-length is 413 at once",
		cfg:   Config{MaxBodyBytes: 10},
		addrs: []string{ep1},
		steps: []step{
			{chatHeaders("content-length", "11"), []*extprocv3.ProcessingResponse{expImmediate(413, "body_too_large", "request body of 11 bytes exceeds the limit of 10 bytes")}},
			{reqBody(chatBody, true), nil},
		},
	}, {
		name:  "chunked body over the limit is 413",
		cfg:   Config{MaxBodyBytes: 10},
		addrs: []string{ep1},
		steps: []step{
			{chatHeaders(), nil},
			{reqBody(chatBody[:8], false), nil},
			{reqBody(chatBody[8:], true), []*extprocv3.ProcessingResponse{expImmediate(413, "body_too_large", "request body exceeds the limit of 10 bytes")}},
		},
	}, {
		name:    "model not served is 404",
		pickErr: scheduler.ErrModelNotServed,
		steps: []step{
			{chatHeaders(), nil},
			{reqBody(chatBody, true), []*extprocv3.ProcessingResponse{expImmediate(404, "model_not_served", scheduler.ErrModelNotServed.Msg)}},
		},
	}, {
		name:    "queue full is 429",
		pickErr: scheduler.ErrQueueFull,
		steps: []step{
			{chatHeaders(), nil},
			{reqBody(chatBody, true), []*extprocv3.ProcessingResponse{expImmediate(429, "queue_full", scheduler.ErrQueueFull.Msg)}},
		},
	}, {
		name:    "no endpoint is 503",
		pickErr: scheduler.ErrNoEndpoint,
		steps: []step{
			{reqHeaders(true, ":method", "GET", ":path", "/v1/models"), []*extprocv3.ProcessingResponse{expImmediate(503, "no_endpoint", scheduler.ErrNoEndpoint.Msg)}},
		},
	}, {
		name:  "empty decision is 503 and still calls Done",
		addrs: nil,
		steps: []step{
			{chatHeaders(), nil},
			{reqBody(chatBody, true), []*extprocv3.ProcessingResponse{expImmediate(503, "no_endpoint", scheduler.ErrNoEndpoint.Msg)}},
		},
		done: []wantDone{{err: true}},
	}, {
		name:    "unknown picker error is a gRPC error so the failure mode applies",
		pickErr: errors.New("boom"),
		steps: []step{
			{chatHeaders(), nil},
			{reqBody(chatBody, true), nil},
		},
		grpcErr: codes.Internal,
	}, {
		name:  "STREAMED request mode is refused",
		addrs: []string{ep1},
		steps: []step{
			{withProtocol(chatHeaders(), filterv3.ProcessingMode_STREAMED, filterv3.ProcessingMode_STREAMED), nil},
		},
		grpcErr: codes.FailedPrecondition,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &fakePicker{addrs: tc.addrs, err: tc.pickErr}
			c := startServer(t, tc.cfg, p, nil, prometheus.NewRegistry())
			err := runSteps(t, c, tc.steps)
			if tc.grpcErr != codes.OK {
				require.Equal(t, tc.grpcErr, status.Code(err), "%v", err)
			} else {
				require.NoError(t, err)
			}
			reqs, done := p.snapshot()
			var got []wantDone
			for _, d := range done {
				got = append(got, wantDone{status: d.Status, served: d.Served, prompt: d.PromptTokens, cached: d.CachedTokens,
					completion: d.CompletionTokens, err: d.Err != nil})
				if d.Err == nil {
					require.Greater(t, d.Total, time.Duration(0))
					if d.Status == 200 {
						require.Greater(t, d.FirstByte, time.Duration(0))
						require.GreaterOrEqual(t, d.Total, d.FirstByte)
					}
				}
			}
			require.Equal(t, tc.done, got)
			if tc.check != nil {
				tc.check(t, reqs)
			}
		})
	}
}

// TestCancelledStreamCallsDoneOnce: Envoy resets the stream mid-response
// (client gone); the scheduler hears about it exactly once.
func TestCancelledStreamCallsDoneOnce(t *testing.T) {
	p := &fakePicker{addrs: []string{ep1}}
	reg := prometheus.NewRegistry()
	c := startServer(t, Config{}, p, nil, reg)
	ctx, cancel := context.WithCancel(context.Background())
	st, err := c.Process(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(chatHeaders()))
	require.NoError(t, st.Send(reqBody(streamBody, true)))
	for range 2 {
		_, err := st.Recv()
		require.NoError(t, err)
	}
	require.NoError(t, st.Send(okHeaders("text/event-stream")))
	_, err = st.Recv()
	require.NoError(t, err)
	require.NoError(t, st.Send(respBody(ev1, false)))
	_, err = st.Recv()
	require.NoError(t, err)
	cancel()
	require.Eventually(t, func() bool {
		_, done := p.snapshot()
		return len(done) > 0
	}, 5*time.Second, 5*time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	_, done := p.snapshot()
	require.Len(t, done, 1)
	require.ErrorIs(t, done[0].Err, errStreamEnded)
	require.Equal(t, 200, done[0].Status)
	require.Equal(t, ep1, done[0].Served)
	require.Eventually(t, func() bool {
		return metricValue(t, reg, "omnious_extproc_streams_total", "end", "cancelled") == 1
	}, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, 0.0, metricValue(t, reg, "inference_objective_running_requests", "model_name", "m1"))
}

func TestMetrics(t *testing.T) {
	p := &fakePicker{addrs: []string{ep1}}
	reg := prometheus.NewRegistry()
	c := startServer(t, Config{}, p, nil, reg)
	require.NoError(t, runSteps(t, c, []step{
		{chatHeaders("x-gateway-model-name-rewrite", "m2"), nil},
		{reqBody(chatBody, true), []*extprocv3.ProcessingResponse{expRouted(ep1, strconv.Itoa(len(strings.Replace(chatBody, "m1", "m2", 1))), HeaderModelRewrite),
			expReqBody(strings.Replace(chatBody, "m1", "m2", 1), true)}},
		{okHeaders("application/json"), []*extprocv3.ProcessingResponse{expRespHeaders(true)}},
		{respBody(jsonResp, true), []*extprocv3.ProcessingResponse{expRespBody(jsonResp, true)}},
	}))
	require.NoError(t, runSteps(t, c, []step{
		{chatHeaders(), nil},
		{reqBody("{", true), []*extprocv3.ProcessingResponse{expImmediate(400, "bad_request", "invalid JSON body: unexpected end of JSON input")}},
	}))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	byName := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			switch {
			case m.Counter != nil:
				byName[mf.GetName()] += m.Counter.GetValue()
			case m.Histogram != nil:
				byName[mf.GetName()] += m.Histogram.GetSampleSum()
			}
		}
	}
	require.Equal(t, 1.0, byName["inference_objective_request_total"])
	require.Equal(t, 1.0, byName["inference_objective_request_error_total"])
	require.Equal(t, 5.0, byName["inference_objective_input_tokens"])
	require.Equal(t, 3.0, byName["inference_objective_output_tokens"])
	require.Equal(t, 2.0, byName["inference_objective_prompt_cached_tokens"])
	require.Equal(t, float64(len(chatBody)), byName["inference_objective_request_sizes"])
	require.Equal(t, float64(len(jsonResp)), byName["inference_objective_response_sizes"])
	require.Equal(t, 2.0, byName["omnious_extproc_streams_total"])
	require.Equal(t, 1.0, byName["omnious_extproc_prompt_mode_total"])
	require.Positive(t, byName["omnious_extproc_route_duration_seconds"])
	require.Equal(t, uint64(2), histogramCount(t, reg, "omnious_extproc_route_duration_seconds"), "the routed request and the rejected one")
	require.Equal(t, 1.0, metricValue(t, reg, "inference_objective_request_total", "target_model_name", "m2"))
}

// histogramCount is the sample count of the histogram name.
func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.Metric[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatalf("no histogram %s", name)
	return 0
}

// metricValue sums the counters and gauges of name whose label has value.
func metricValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			for _, lp := range m.Label {
				if lp.GetName() == label && lp.GetValue() == value {
					sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
	}
	return sum
}

// TestBufferReuse: recycled body buffers never leak one request's bytes
// into another's (chunked bodies, with and without a rewrite).
func TestBufferReuse(t *testing.T) {
	c := startServer(t, Config{}, &fakePicker{addrs: []string{ep1}}, nil, nil)
	for i, fill := range []string{"a", "b", "c", "d"} {
		body := `{"model":"m1","prompt":"` + strings.Repeat(fill, 100000-i*7000) + `"}`
		hdr := []string{":method", "POST", ":path", "/v1/completions", "content-length", strconv.Itoa(len(body))}
		if i == 2 {
			hdr = hdr[:4] // no Content-Length: the gathering buffer grows
		}
		want := body
		if i%2 == 1 {
			hdr = append(hdr, HeaderModelRewrite, "m2")
			want = strings.Replace(body, `"m1"`, `"m2"`, 1)
		}
		cl := strconv.Itoa(len(want))
		var out []*extprocv3.ProcessingResponse
		if i%2 == 1 {
			out = append(out, expRouted(ep1, cl, HeaderModelRewrite))
		} else {
			out = append(out, expRouted(ep1, cl))
		}
		for off := 0; off < len(want); off += 62000 {
			end := min(off+62000, len(want))
			out = append(out, expReqBody(want[off:end], end == len(want)))
		}
		require.NoError(t, runSteps(t, c, []step{
			{reqHeaders(false, hdr...), nil},
			{reqBody(body[:30000], false), nil},
			{reqBody(body[30000:70000], false), nil},
			{reqBody(body[70000:], true), out},
		}))
	}
}

// idPicker routes each request to an endpoint named after its id, so a
// reply shows whose it is.
type idPicker struct{}

func (idPicker) Admit(context.Context, *scheduler.Request) (*scheduler.Ticket, error) {
	return nil, nil
}

func (idPicker) Pick(r *scheduler.Request, _ *scheduler.Ticket) (*scheduler.Decision, error) {
	return &scheduler.Decision{Endpoints: []*endpoint.Endpoint{{Addr: idAddr(r.ID)}}}, nil
}

func idAddr(id string) string { return "10.1." + id + ":8000" }

// TestRecycledStreamsKeepTheirOwn: streams run side by side on recycled
// stream state (and under -race), each with its own endpoint, body size,
// rewrite or none and response, and some end by the idle timer or a
// reset, yet every reply is exactly its own request's: no endpoint,
// header, body or response rewrite of one stream reaches another.
func TestRecycledStreamsKeepTheirOwn(t *testing.T) {
	// The idle timer runs for every stream, not only the stalling ones: it
	// must be far longer than a client merely descheduled between two
	// messages on a loaded machine, so it is a second, and one exchange in
	// sixteen stalls into it.
	const idle = time.Second
	c := startServer(t, Config{RequestIdleTimeout: idle}, idPicker{}, nil, nil)
	exchange := func(w, i int) error {
		id := fmt.Sprintf("%d.%d", w, i)
		dest := idAddr(id)
		body := `{"model":"m1","prompt":"` + strings.Repeat(string(rune('a'+(w+i)%26)), 10+(w*37+i*11)%3000) + `"}`
		hdr := []string{":method", "POST", ":path", "/v1/completions", "content-length", strconv.Itoa(len(body)), headerRequestID, id}
		kind := i % 4
		if kind == 2 && i%16 != 2 {
			kind = 0
		}
		switch kind {
		case 0: // routed and answered, the body in one message
			_, err := drive(c, []step{
				{reqHeaders(false, hdr...), nil},
				{reqBody(body, true), []*extprocv3.ProcessingResponse{expRouted(dest, strconv.Itoa(len(body))), expReqBody(body, true)}},
				{okHeaders("application/json"), []*extprocv3.ProcessingResponse{expRespHeaders(false)}},
				{respBody(jsonResp, true), []*extprocv3.ProcessingResponse{expRespBody(jsonResp, true)}},
			})
			return err
		case 1: // rewritten both ways, the body in two messages
			want := strings.Replace(body, `"m1"`, `"m2"`, 1)
			_, err := drive(c, []step{
				{reqHeaders(false, append(hdr, HeaderModelRewrite, "m2")...), nil},
				{reqBody(body[:5], false), nil},
				{reqBody(body[5:], true), []*extprocv3.ProcessingResponse{expRouted(dest, strconv.Itoa(len(want)), HeaderModelRewrite), expReqBody(want, true)}},
				{okHeaders("application/json"), []*extprocv3.ProcessingResponse{expRespHeaders(true)}},
				{respBody(strings.Replace(jsonResp, `"m1"`, `"m2"`, 1), true), []*extprocv3.ProcessingResponse{expRespBody(jsonResp, true)}},
			})
			return err
		case 2: // the client stalls: the idle timer answers
			_, err := drive(c, []step{
				{reqHeaders(false, hdr...), nil},
				{reqBody(body[:5], false), []*extprocv3.ProcessingResponse{
					expImmediate(408, "request_timeout", fmt.Sprintf("no request data from the client for %s", idle))}},
			})
			return err
		default: // Envoy resets the stream after the routing reply
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			st, err := c.Process(ctx)
			if err != nil {
				return err
			}
			for _, m := range []*extprocv3.ProcessingRequest{reqHeaders(false, hdr...), reqBody(body, true)} {
				if err := st.Send(m); err != nil {
					return err
				}
			}
			for _, want := range []*extprocv3.ProcessingResponse{expRouted(dest, strconv.Itoa(len(body))), expReqBody(body, true)} {
				got, err := st.Recv()
				if err != nil {
					return err
				}
				if !proto.Equal(want, got) {
					return fmt.Errorf("want %s\ngot  %s", prototext.Format(want), prototext.Format(got))
				}
			}
			return nil
		}
	}
	const workers, each = 6, 40
	errs := make(chan error, workers*each)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				if err := exchange(w, i); err != nil {
					errs <- fmt.Errorf("stream %d.%d: %w", w, i, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// TestClientCancelsNeverCountAgainstReplicas: Envoy-like streams that end
// early (after the routing reply with no response phase, after response
// headers, mid-body) never open a breaker of the real scheduler, and
// routing does not fall back; a 5xx still counts.
func TestClientCancelsNeverCountAgainstReplicas(t *testing.T) {
	reg := prometheus.NewRegistry()
	sched, err := scheduler.New(must(scheduler.ParseConfig(nil)), nil, reg, nil)
	require.NoError(t, err)
	var targets []scheduler.Target
	for i, a := range []string{ep1, "10.0.0.2:8000", "10.0.0.3:8000"} {
		targets = append(targets, scheduler.Target{Endpoint: endpoint.Endpoint{Addr: a, Model: "m1"}, Replica: kvindex.Replica(i)})
	}
	sched.SetEndpoints(targets)
	c := startServer(t, Config{}, sched, nil, reg)

	// end is how the stream ends after the routing reply; status is the
	// upstream status the gateway reports first (0: none).
	run := func(status int, end func(st extprocv3.ExternalProcessor_ProcessClient, cancel context.CancelFunc)) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		st, err := c.Process(ctx)
		require.NoError(t, err)
		require.NoError(t, st.Send(chatHeaders()))
		require.NoError(t, st.Send(reqBody(streamBody, true)))
		for range 2 {
			_, err := st.Recv()
			require.NoError(t, err)
		}
		if status > 0 {
			require.NoError(t, st.Send(withServed(respHeaders(false, ":status", strconv.Itoa(status), "content-type", "text/event-stream"), ep1)))
			_, err = st.Recv()
			require.NoError(t, err)
		}
		end(st, cancel)
	}
	closeSend := func(st extprocv3.ExternalProcessor_ProcessClient, _ context.CancelFunc) {
		require.NoError(t, st.CloseSend())
		_, _ = st.Recv()
	}
	reset := func(_ extprocv3.ExternalProcessor_ProcessClient, cancel context.CancelFunc) { cancel() }
	midBody := func(st extprocv3.ExternalProcessor_ProcessClient, cancel context.CancelFunc) {
		require.NoError(t, st.Send(respBody(ev1, false)))
		_, err := st.Recv()
		require.NoError(t, err)
		cancel()
	}
	outcome := func(o string) float64 {
		return metricValue(t, reg, "omnious_epp_request_outcomes_total", "outcome", o)
	}
	ends := []struct {
		status int
		end    func(extprocv3.ExternalProcessor_ProcessClient, context.CancelFunc)
	}{{0, closeSend}, {0, reset}, {200, reset}, {200, midBody}}
	for i := range 40 {
		e := ends[i%len(ends)]
		run(e.status, e.end)
	}
	require.Eventually(t, func() bool { return outcome("unknown") == 40 }, 5*time.Second, 5*time.Millisecond)
	require.Zero(t, outcome("failure"))
	require.Zero(t, metricValue(t, reg, "omnious_epp_decisions_total", "reason", "fallback"))
	require.Equal(t, 3, sched.Capacity().Models[0].Healthy, "no breaker opened")

	// Evidence still counts: three 5xx served by one replica open its
	// breaker.
	for range 3 {
		run(503, reset)
	}
	require.Eventually(t, func() bool { return outcome("failure") == 3 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, 2, sched.Capacity().Models[0].Healthy)
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
