package conformance

import (
	"strings"
	"testing"
)

func FuzzParseStream(f *testing.F) {
	f.Add("data: {\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":" +
		"[{\"index\":0,\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{}\"}}]}," +
		"\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n")
	f.Add("data: {\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	f.Add("data: {\"error\":{\"message\":\"boom\"}}\n\n")
	f.Add("data: [DONE]\n\n")
	f.Fuzz(func(t *testing.T, s string) {
		res, err := parseStream(strings.NewReader(s), "m")
		if err == nil && res.finish == "" {
			t.Fatalf("accepted a stream without finish_reason")
		}
	})
}
