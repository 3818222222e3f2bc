package envoy

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// sseData is the data: payloads of an SSE answer, in order.
func sseData(body []byte) []string {
	var out []string
	for line := range strings.Lines(string(body)) {
		if d, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// requireFraming: the request reached the replica chunked (Envoy 1.40
// forwards a FULL_DUPLEX_STREAMED body so, whatever Content-Length the EPP
// sets) or with a Content-Length equal to the body's length.
func requireFraming(t *testing.T, s seen) {
	t.Helper()
	if s.contentLength != -1 {
		require.Equal(t, int64(s.bodyLen), s.contentLength, "Content-Length is the body's length")
	}
}

// TestAPIs sends chat, completions and responses, streamed and not,
// through Envoy and checks each answer's OpenAI shape and that the
// replica Envoy connected to is the one the EPP named.
func TestAPIs(t *testing.T) {
	s := startStack(t, "envoy.yaml", opts{})
	tests := []struct {
		name, path string
		body       map[string]any
		stream     bool
	}{
		{"chat", "/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "Say hello."}}}, false},
		{"chat streamed", "/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "Say hello."}}}, true},
		{"completions", "/v1/completions", map[string]any{"prompt": "Once upon a time"}, false},
		{"completions streamed", "/v1/completions", map[string]any{"prompt": "Once upon a time"}, true},
		{"responses", "/v1/responses", map[string]any{"input": "Say hello.", "instructions": "Be brief."}, false},
		{"responses streamed", "/v1/responses", map[string]any{"input": "Say hello.", "instructions": "Be brief."}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := map[string]any{"model": model, "stream": tc.stream}
			for k, v := range tc.body {
				body[k] = v
			}
			if tc.path == "/v1/responses" {
				body["max_output_tokens"] = 8
			} else {
				body["max_tokens"] = 8
			}
			raw, _ := json.Marshal(body)
			before := len(s.allSeen())
			code, hdr, got, err := s.post(context.Background(), tc.path, raw, nil)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, code, "%s", got)
			if !tc.stream {
				require.Contains(t, hdr.Get("Content-Type"), "application/json")
				var ans map[string]any
				require.NoError(t, json.Unmarshal(got, &ans), "%s", got)
				require.Equal(t, model, ans["model"])
				require.NotNil(t, ans["usage"], "%s", got)
				if tc.path == "/v1/responses" {
					require.NotEmpty(t, ans["output"])
				} else {
					require.NotEmpty(t, ans["choices"])
				}
			} else {
				require.Contains(t, hdr.Get("Content-Type"), "text/event-stream")
				data := sseData(got)
				require.NotEmpty(t, data, "%s", got)
				if tc.path == "/v1/responses" {
					require.Regexp(t, `event: response\.(completed|incomplete)\n`, string(got), "the stream ends with the response's terminal event")
				} else {
					require.Equal(t, "[DONE]", data[len(data)-1])
					for _, d := range data[:len(data)-1] {
						var c map[string]any
						require.NoError(t, json.Unmarshal([]byte(d), &c), d)
						require.Equal(t, model, c["model"])
						require.Nil(t, c["usage"], "usage the client did not ask for reached it: %s", d)
					}
				}
			}
			all := s.allSeen()
			require.Len(t, all, before+1)
			last := all[len(all)-1]
			require.Equal(t, tc.path, last.path)
			require.NotNil(t, s.replicaAt(last.dest), "Envoy forwarded %q, no replica's address", last.dest)
		})
	}
}

// TestDestinationHonoured sends requests of many prefixes and checks that
// every one reached exactly the replica the EPP named in
// x-gateway-destination-endpoint (each front compares the header Envoy
// forwarded with its own address), and that both replicas served.
func TestDestinationHonoured(t *testing.T) {
	s := startStack(t, "envoy.yaml", opts{replicas: 3})
	const n = 60
	for i := range n {
		code, _, got, err := s.post(context.Background(), "/v1/chat/completions", chat(words(i%12, 600), i%2 == 0, 4), nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code, "%s", got)
	}
	used := 0
	total := 0
	for _, r := range s.replicas {
		reqs := r.requests()
		total += len(reqs)
		if len(reqs) > 0 {
			used++
		}
		for _, q := range reqs {
			require.Equal(t, r.addr, q.dest, "a request for %s reached %s", q.dest, r.addr)
		}
	}
	require.Equal(t, n, total, "every request reached one replica once")
	require.Greater(t, used, 1, "the EPP spread 12 prefixes over the replicas")
}

// TestBodySizes sends chat bodies of 1 KB, 32 KB, 200 KB (text) and 10 MB
// (an image data URL beside a short text, as multimodal clients send)
// through Envoy's FULL_DUPLEX_STREAMED path, streamed and not, and checks
// that the replica received the whole body with a Content-Length equal to
// its length.
func TestBodySizes(t *testing.T) {
	s := startStack(t, "envoy.yaml", opts{})
	image := "data:image/png;base64," + base64.StdEncoding.EncodeToString([]byte(words(7, 10<<20*3/4)))
	tests := []struct {
		name string
		body []byte
	}{
		{"1KB", chat(words(1, 1<<10), false, 4)},
		{"32KB", chat(words(2, 32<<10), false, 4)},
		{"200KB", chat(words(3, 200<<10), false, 4)},
		{"10MB", func() []byte {
			b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 4, "messages": []any{map[string]any{"role": "user",
				"content": []any{map[string]any{"type": "text", "text": "What is in this picture?"},
					map[string]any{"type": "image_url", "image_url": map[string]any{"url": image}}}}}})
			return b
		}()},
	}
	for _, tc := range tests {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s stream=%v", tc.name, stream), func(t *testing.T) {
				body := tc.body
				if stream {
					var m map[string]any
					require.NoError(t, json.Unmarshal(body, &m))
					m["stream"] = true
					m["stream_options"] = map[string]any{"include_usage": true}
					body, _ = json.Marshal(m)
				}
				before := len(s.allSeen())
				code, _, got, err := s.post(context.Background(), "/v1/chat/completions", body, nil)
				require.NoError(t, err)
				require.Equal(t, http.StatusOK, code, "%.300s", got)
				all := s.allSeen()
				require.Len(t, all, before+1)
				last := all[len(all)-1]
				require.Equal(t, len(body), last.bodyLen, "the replica got the body whole")
				requireFraming(t, last)
			})
		}
	}
}

// TestIncludeUsageInjected: a streamed chat without stream_options reaches
// the replica with stream_options.include_usage true and a Content-Length
// equal to the rewritten body's length; the client gets no usage chunk.
// A client that asked for usage gets it.
func TestIncludeUsageInjected(t *testing.T) {
	s := startStack(t, "envoy.yaml", opts{replicas: 1})
	for _, asked := range []bool{false, true} {
		t.Run(fmt.Sprintf("asked=%v", asked), func(t *testing.T) {
			m := map[string]any{"model": model, "max_tokens": 6, "stream": true,
				"messages": []any{map[string]any{"role": "user", "content": words(5, 2000)}}}
			if asked {
				m["stream_options"] = map[string]any{"include_usage": true}
			}
			body, _ := json.Marshal(m)
			code, _, got, err := s.post(context.Background(), "/v1/chat/completions", body, nil)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, code, "%s", got)
			all := s.allSeen()
			last := all[len(all)-1]
			require.NotNil(t, last.includeUsage)
			require.True(t, *last.includeUsage)
			requireFraming(t, last)
			if !asked {
				require.Greater(t, last.bodyLen, len(body), "the body grew by the injected option")
			} else {
				require.Equal(t, len(body), last.bodyLen)
			}
			usage := 0
			for _, d := range sseData(got) {
				var c map[string]any
				if json.Unmarshal([]byte(d), &c) == nil && c["usage"] != nil {
					usage++
				}
			}
			if asked {
				require.Equal(t, 1, usage, "%s", got)
			} else {
				require.Zero(t, usage, "%s", got)
			}
		})
	}
}
