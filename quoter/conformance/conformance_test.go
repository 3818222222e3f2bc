package conformance_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/sim/simtest"
	"github.com/omnious/provider-node/quoter/conformance"
)

const model = "Qwen/Qwen3-32B"

func TestConformanceAgainstSimulator(t *testing.T) {
	for _, flavour := range []string{"vllm", "sglang"} {
		t.Run(flavour, func(t *testing.T) {
			base := simtest.URL(t, flavour)
			cfg := conformance.Config{URL: base, Model: model, CheckTimeout: 20 * time.Second}

			rep := conformance.Run(context.Background(), cfg, conformance.Full)
			require.True(t, rep.Passed(), rep.String())
			require.Len(t, rep.Results, 6)
			require.NoError(t, rep.Err())
			require.Contains(t, rep.String(), "result: PASS (6 checks)")

			// The serving URL may be given with its /v1 suffix.
			cfg.URL = base + "/v1"
			require.True(t, conformance.Run(context.Background(), cfg, conformance.Quick).Passed())

			cfg.URL = base
			simtest.SetFaults(t, base, `{"reject_auto_tool_choice":true}`)
			rep = conformance.Run(context.Background(), cfg, conformance.Full)
			require.False(t, rep.Passed())
			require.Equal(t, []string{conformance.CheckToolAuto}, rep.Failed())
			require.ErrorContains(t, rep.Err(), "tool-auto-stream: POST /v1/chat/completions (stream): HTTP 400")
			require.Contains(t, rep.String(), "FAIL tool-auto-stream")
			require.Contains(t, rep.String(), "result: FAIL (tool-auto-stream)")

			simtest.SetFaults(t, base, `{"error_rate":1,"error_status":503}`)
			rep = conformance.Run(context.Background(), cfg, conformance.Quick)
			require.Equal(t, []string{conformance.CheckChat, conformance.CheckToolAuto}, rep.Failed(),
				"model listing is not fault-injected; generation is")

			simtest.SetFaults(t, base, `{}`)
			require.True(t, conformance.Run(context.Background(), cfg, conformance.Full).Passed())
		})
	}
}

func TestConformanceWrongModel(t *testing.T) {
	base := simtest.URL(t, "vllm")
	rep := conformance.Run(context.Background(), conformance.Config{URL: base, Model: "other/model"}, conformance.Quick)
	require.False(t, rep.Passed())
	require.Contains(t, rep.Failed(), conformance.CheckModels)
	require.Contains(t, rep.Err().Error(), `/v1/models does not list "other/model"`)
}

// sse serves a canned chat stream for one request shape.
func sse(chunks ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		var b bytes.Buffer
		for _, c := range chunks {
			fmt.Fprintf(&b, "data: %s\n\n", c)
		}
		b.WriteString("data: [DONE]\n\n")
		_, _ = w.Write(b.Bytes())
	}
}

// TestMalformedToolDeltas feeds hand-made streams that a lax client would
// accept; each must fail the streamed tool-call check with its reason.
func TestMalformedToolDeltas(t *testing.T) {
	const head = `{"object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"tool_calls":[`
	const tail = `]},"finish_reason":%s}]}`
	chunk := func(calls, finish string) string { return head + calls + fmt.Sprintf(tail, finish) }
	for _, tc := range []struct {
		name   string
		chunks []string
		want   string
	}{
		{"well formed", []string{
			chunk(`{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather"}}`, "null"),
			chunk(`{"index":0,"function":{"arguments":"{\"city\":"}}`, "null"),
			chunk(`{"index":0,"function":{"arguments":"\"Paris\"}"}}`, `"tool_calls"`),
		}, ""},
		{"no id", []string{chunk(`{"index":0,"type":"function","function":{"name":"get_weather","arguments":"{}"}}`, `"tool_calls"`)}, "has no id"},
		{"no type", []string{chunk(`{"index":0,"id":"c","function":{"name":"get_weather","arguments":"{}"}}`, `"tool_calls"`)}, `want "function"`},
		{"no name", []string{chunk(`{"index":0,"id":"c","type":"function","function":{"arguments":"{}"}}`, `"tool_calls"`)}, "no function.name"},
		{"no index", []string{chunk(`{"id":"c","type":"function","function":{"name":"get_weather","arguments":"{}"}}`, `"tool_calls"`)}, "without index"},
		{"bad json", []string{chunk(`{"index":0,"id":"c","type":"function","function":{"name":"get_weather","arguments":"{\"city\""}}`, `"tool_calls"`)}, "not a JSON object"},
		{"renamed", []string{
			chunk(`{"index":0,"id":"c","type":"function","function":{"name":"get_weather"}}`, "null"),
			chunk(`{"index":0,"function":{"name":"get_time","arguments":"{}"}}`, `"tool_calls"`),
		}, "changed name"},
		{"unknown function", []string{chunk(`{"index":0,"id":"c","type":"function","function":{"name":"rm_rf","arguments":"{}"}}`, `"tool_calls"`)}, "unknown function"},
		{"wrong finish", []string{chunk(`{"index":0,"id":"c","type":"function","function":{"name":"get_weather","arguments":"{}"}}`, `"stop"`)}, "want tool_calls"},
		{"no call", []string{`{"object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"sunny"},"finish_reason":"stop"}]}`}, "no tool call produced"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mux := http.NewServeMux()
			mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
				_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"m"}]}`))
			})
			mux.HandleFunc("POST /v1/chat/completions", sse(tc.chunks...))
			srv := httptest.NewServer(mux)
			defer srv.Close()
			rep := conformance.Run(context.Background(), conformance.Config{URL: srv.URL, Model: "m", Attempts: 1}, conformance.Quick)
			var auto conformance.Result
			for _, r := range rep.Results {
				if r.Name == conformance.CheckToolAuto {
					auto = r
				}
			}
			require.Equal(t, conformance.CheckToolAuto, auto.Name)
			if tc.want == "" {
				require.True(t, auto.OK, auto.Error)
				return
			}
			require.False(t, auto.OK)
			require.Contains(t, auto.Error, tc.want)
		})
	}
}
