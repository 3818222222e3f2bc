package openai

import (
	"strings"
	"testing"
)

var sinkEvents int

// BenchmarkEvents reads a 200-token chat stream as vLLM writes it.
func BenchmarkEvents(b *testing.B) {
	var s strings.Builder
	for range 200 {
		s.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	}
	s.WriteString("data: [DONE]\n\n")
	body := s.String()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		for ev, err := range Events(strings.NewReader(body), 0) {
			if err != nil {
				b.Fatal(err)
			}
			sinkEvents += len(ev.Data)
		}
	}
}
