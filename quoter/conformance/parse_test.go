package conformance

import (
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"
)

// TestParseStream: what parseStream accepts of the wire (CRLF, comments,
// reads of one byte) and how it names a stream that breaks.
func TestParseStream(t *testing.T) {
	const hi = `{"object":"chat.completion.chunk","model":"m","choices":[{"delta":{"content":"hi"},"finish_reason":"stop"}]}`
	for _, tc := range []struct {
		name, body string
		err        string
	}{
		{"LF", "data: " + hi + "\n\ndata: [DONE]\n\n", ""},
		{"CRLF and keep-alives", ": ping\r\n\r\ndata: " + hi + "\r\n\r\n: ping\r\n\r\ndata: [DONE]\r\n\r\n", ""},
		{"no [DONE]", "data: " + hi + "\n\n", "stream ended after 1 chunks without data: [DONE]"},
		{"an error event", `data: {"error":{"message":"boom"}}` + "\n\n", "error event in stream: boom"},
		{"not JSON", "data: {\"object\":\n\n", "chunk 0 is not JSON"},
		{"a line over 4 MiB", "data: " + hi + "\n\ndata: " + strings.Repeat(" ", 4<<20) + "\n\n", "stream broke after 1 chunks: stream line too long"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := parseStream(iotest.HalfReader(strings.NewReader(tc.body)), "m")
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, "hi", res.content)
			require.Equal(t, "stop", res.finish)
		})
	}
}
