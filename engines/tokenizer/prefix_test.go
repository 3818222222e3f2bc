package tokenizer

import (
	"encoding/json"
	"fmt"
	"github.com/omnious/provider-node/internal/cputime"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/openai"
)

// TestPrefixCacheMatchesEncode replays every golden chat turn by turn
// through one cache: each request must tokenize exactly as without the
// cache, and later turns must reuse earlier ones.
func TestPrefixCacheMatchesEncode(t *testing.T) {
	for _, fam := range chatFamilies {
		t.Run(fam, func(t *testing.T) {
			tok := loadFamily(t, fam)
			ct, err := tok.NewChatTemplate()
			require.NoError(t, err)
			pc := NewPrefixCache(tok, PrefixCacheConfig{})
			vecs := readJSONL[chatVector](t, filepath.Join("testdata", "golden", fam+".chat.jsonl"))
			requests := 0
			for _, v := range vecs {
				for n := 1; n <= len(v.Messages); n++ {
					in := ChatInput{Messages: v.Messages[:n], Tools: v.Tools, AddGenerationPrompt: n < len(v.Messages) || v.AddGenerationPrompt, Kwargs: v.Kwargs}
					text, err := ct.Render(in)
					require.NoError(t, err, v.Name)
					require.Equal(t, tok.Encode(nil, text), pc.Encode(nil, text), "%s, %d messages", v.Name, n)
					requests++
				}
				require.Equal(t, v.IDs, pc.Encode([]uint32{}, v.Text), v.Name)
				requests++
			}
			st := pc.Stats()
			require.Equal(t, uint64(requests), st.Lookups)
			require.Greater(t, st.Hits, st.Lookups/2, "multi-turn chats should mostly reuse a prefix")
			require.Greater(t, st.ReusedIDs, uint64(0))
		})
	}
}

// TestPrefixCacheAppendsToDst checks that ids are appended after existing
// ones and that the caller mutating its slice does not corrupt the cache.
func TestPrefixCacheAppendsToDst(t *testing.T) {
	tok := loadFamily(t, "qwen3")
	pc := NewPrefixCache(tok, PrefixCacheConfig{MaxEntries: 8, CutsPerText: 2})
	text := "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"
	want := tok.Encode(nil, text)
	got := pc.Encode([]uint32{7, 7}, text)
	require.Equal(t, append([]uint32{7, 7}, want...), got)
	for i := range got {
		got[i] = 0
	}
	require.Equal(t, want, pc.Encode(nil, text))
	require.Equal(t, uint64(1), pc.Stats().Hits)
}

func TestChatTemplateErrors(t *testing.T) {
	_, err := NewChatTemplate("", nil)
	require.Error(t, err)
	_, err = NewChatTemplate("{% if %}", nil)
	require.Error(t, err)
	ct, err := NewChatTemplate("{{ messages[0].content }}", nil)
	require.NoError(t, err)
	tests := []struct {
		name string
		in   ChatInput
	}{
		{"image part", ChatInput{Messages: []openai.Message{{Role: "user", Content: []byte(`[{"type":"image_url","image_url":{"url":"x"}}]`)}}}},
		{"bad content", ChatInput{Messages: []openai.Message{{Role: "user", Content: []byte(`{"a":1}`)}}}},
		{"bad kwargs", ChatInput{Messages: []openai.Message{{Role: "user", Content: []byte(`"x"`)}}, Kwargs: []byte(`[1]`)}},
		{"bad parameters", ChatInput{Messages: []openai.Message{{Role: "user", Content: []byte(`"x"`)}}, Tools: []openai.Tool{{Type: "function", Function: openai.ToolFunction{Name: "f", Parameters: []byte(`{"a":`)}}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ct.Render(tc.in)
			require.Error(t, err)
		})
	}
}

// corpus is a mixed benchmark corpus: every golden prompt of a family.
func corpus(b *testing.B, fam string) string {
	vecs := readJSONL[textVector](b, filepath.Join("testdata", "golden", fam+".text.jsonl"))
	var sb strings.Builder
	for _, v := range vecs {
		sb.WriteString(v.Text)
		sb.WriteByte('\n')
	}
	return sb.String()
}

// BenchmarkTokenize reports throughput with a warm word cache (steady
// state) and with the cache emptied every pass (cold), on the mixed golden
// prompts of each family and on each of its corpus documents, one script
// each (the licence, Go source, Chinese documentation, mixed-script text).
// BenchmarkTokenizeVsHF runs the same documents beside HF tokenizers.
func BenchmarkTokenize(b *testing.B) {
	for _, fam := range families {
		tok := loadFamily(b, fam)
		texts := [][2]string{{"prompts", corpus(b, fam)}}
		docs := goldenCorpus(b, fam)
		for _, s := range corpusScripts {
			texts = append(texts, [2]string{s, docs[s].Text})
		}
		for _, tx := range texts {
			text := tx[1]
			for _, cold := range []bool{false, true} {
				name := fam + "/" + tx[0] + "/warm"
				if cold {
					name = fam + "/" + tx[0] + "/cold"
				}
				b.Run(name, func(b *testing.B) {
					dst := tok.Encode(nil, text)
					b.SetBytes(int64(len(text)))
					b.ReportAllocs()
					cpu0, ok := cputime.Now()
					n := 0
					for b.Loop() {
						if cold {
							tok.cache = newWordCache()
						}
						dst = tok.Encode(dst[:0], text)
						n++
					}
					if cpu1, ok1 := cputime.Now(); ok && ok1 && cpu1 > cpu0 {
						b.ReportMetric(float64(n*len(text))/(cpu1-cpu0).Seconds()/1e6, "cpu-MB/s")
					}
					b.ReportMetric(float64(len(dst)), "tokens/op")
				})
			}
		}
	}
}

// conversation renders a Qwen3 chat with tools of about n tokens.
func conversation(tb testing.TB, tok *HF, ct *ChatTemplate, n int) string {
	r := rand.New(rand.NewPCG(1, 2))
	words := strings.Fields("the of and to in is was for on that with as by at from router cache token prefix engine request latency GPU replica scheduler 東京 データ 🚀 don't it's 42 3.14 func() {}")
	say := func(k int) string {
		w := make([]string, k)
		for i := range w {
			w[i] = words[r.IntN(len(words))]
		}
		return strings.Join(w, " ")
	}
	msgs := []openai.Message{{Role: "system", Content: jsonString(say(40))}}
	tools := []openai.Tool{{Type: "function", Function: openai.ToolFunction{Name: "search", Description: "Search.", Parameters: []byte(`{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}`)}}}
	for {
		msgs = append(msgs, openai.Message{Role: "user", Content: jsonString(say(120))}, openai.Message{Role: "assistant", Content: jsonString(say(200))})
		text, err := ct.Render(ChatInput{Messages: msgs, Tools: tools})
		require.NoError(tb, err)
		if len(tok.Encode(nil, text)) >= n {
			return text
		}
	}
}

func jsonString(s string) []byte { return []byte(fmt.Sprintf("%q", s)) }

// BenchmarkChatTurnCachedPrefix is the per-request cost of a new ~200-token
// user turn on top of an 8k-token conversation whose prefix is cached.
func BenchmarkChatTurnCachedPrefix(b *testing.B) {
	tok := loadFamily(b, "qwen3")
	ct, err := tok.NewChatTemplate()
	require.NoError(b, err)
	conv := conversation(b, tok, ct, 8192)
	pc := NewPrefixCache(tok, PrefixCacheConfig{})
	dst := pc.Encode(nil, conv)
	base := len(dst)
	r := rand.New(rand.NewPCG(3, 4))
	words := strings.Fields("please summarize the latest cache hit ratio for replica seven and compare it with yesterday, noting any 異常 or spikes 📈 above 90% — then propose two fixes")
	turns := make([]string, 256)
	for i := range turns {
		w := make([]string, 150)
		for j := range w {
			w[j] = words[r.IntN(len(words))]
		}
		turns[i] = strings.Join(w, " ")
	}
	newTokens := 0
	i := 0
	b.ReportAllocs()
	cpu0, ok := cputime.Now()
	for b.Loop() {
		// The iteration number keeps every request new, as in production.
		text := conv + "<|im_start|>user\n" + fmt.Sprint(i) + " " + turns[i%len(turns)] + "<|im_end|>\n<|im_start|>assistant\n"
		dst = pc.Encode(dst[:0], text)
		newTokens += len(dst) - base
		i++
	}
	if cpu1, ok1 := cputime.Now(); ok && ok1 {
		b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(i), "cpu-µs/op")
	}
	b.ReportMetric(float64(base), "prefix-tokens")
	b.ReportMetric(float64(newTokens)/float64(i), "new-tokens/op")
}

// BenchmarkChatRender is the cost of rendering the same 8k-token
// conversation through the Qwen3 template (done once per request).
func BenchmarkChatRender(b *testing.B) {
	tok := loadFamily(b, "qwen3")
	ct, err := tok.NewChatTemplate()
	require.NoError(b, err)
	r := rand.New(rand.NewPCG(1, 2))
	var msgs []openai.Message
	for len(msgs) < 40 {
		msgs = append(msgs, openai.Message{Role: "user", Content: jsonString(strings.Repeat("word ", 100+r.IntN(50)))}, openai.Message{Role: "assistant", Content: jsonString(strings.Repeat("reply ", 100))})
	}
	in := ChatInput{Messages: msgs, AddGenerationPrompt: true}
	b.ReportAllocs()
	for b.Loop() {
		_, err := ct.Render(in)
		require.NoError(b, err)
	}
}

// TestConcurrentEncode shares one tokenizer and one prefix cache between
// goroutines (run with -race); its entries, cut every 64 bytes, leave it
// while others chain to them, and the count still ends exact.
func TestConcurrentEncode(t *testing.T) {
	tok := loadFamily(t, "qwen3")
	pc := NewPrefixCache(tok, PrefixCacheConfig{MaxEntries: 64, CutEvery: 64})
	vecs := readJSONL[chatVector](t, filepath.Join("testdata", "golden", "qwen3.chat.jsonl"))
	errs := make(chan error, 4)
	for g := range 4 {
		go func() {
			for i := range vecs {
				v := vecs[(i+g*7)%len(vecs)]
				var got []uint32
				if i%2 == 0 {
					got = pc.Encode(nil, v.Text)
				} else {
					got = tok.Encode(nil, v.Text)
				}
				if !equalIDs(got, v.IDs) {
					errs <- fmt.Errorf("goroutine %d: %s differs", g, v.Name)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
	require.Equal(t, retained(pc), pc.bytes.Load())
}

// TestPrefixCacheStandIn replays growing conversations and random texts
// with added tokens through a cache over the stand-in: every result must
// equal the stand-in's own, and later turns must reuse earlier ones.
func TestPrefixCacheStandIn(t *testing.T) {
	tok := NewStandIn()
	pc := NewPrefixCache(tok, PrefixCacheConfig{MaxEntries: 64, CutsPerText: 4})
	rng := rand.New(rand.NewPCG(3, 4))
	randText := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteString(standInAlphabet[rng.IntN(len(standInAlphabet))])
		}
		return b.String()
	}
	content := func(s string) []byte {
		b, err := json.Marshal(s)
		require.NoError(t, err)
		return b
	}
	for conv := range 20 {
		msgs := []openai.Message{{Role: "system", Content: content("You are assistant " + randText(5))}}
		for turn := range 6 {
			msgs = append(msgs, openai.Message{Role: "user", Content: content(randText(30))})
			text, err := RenderStandInChat(msgs, nil, true)
			require.NoError(t, err)
			require.Equal(t, tok.Encode(nil, text), pc.Encode(nil, text), "conversation %d turn %d", conv, turn)
			msgs = append(msgs, openai.Message{Role: "assistant", Content: content(randText(10))})
		}
	}
	for range 500 {
		text := randText(rng.IntN(60))
		require.Equal(t, tok.Encode([]uint32{}, text), pc.Encode([]uint32{}, text), "%q", text)
	}
	st := pc.Stats()
	require.Greater(t, st.Hits, uint64(100), "turns after the first reuse the conversation so far")
}

// TestPrefixCacheBoundsBytes: unique long prompts cannot grow the cache
// past MaxBytes, a text too large for it is not cached, and results stay
// exact throughout.
func TestPrefixCacheBoundsBytes(t *testing.T) {
	tok := NewStandIn()
	const maxBytes = 64 << 10
	pc := NewPrefixCache(tok, PrefixCacheConfig{MaxBytes: maxBytes})
	rng := rand.New(rand.NewPCG(5, 6))
	words := strings.Fields("alpha beta gamma delta epsilon zeta eta theta iota kappa")
	for i := range 300 {
		var b strings.Builder
		fmt.Fprintf(&b, "<|im_start|>user\n%d", i)
		for range 300 {
			b.WriteString(" " + words[rng.IntN(len(words))])
		}
		b.WriteString("<|im_end|>\n<|im_start|>assistant\n")
		text := b.String()
		require.Equal(t, tok.Encode(nil, text), pc.Encode(nil, text))
		require.LessOrEqual(t, pc.bytes.Load(), int64(maxBytes))
	}
	require.Positive(t, pc.bytes.Load())
	require.Positive(t, pc.cache.Len())

	before := pc.bytes.Load()
	huge := "<|im_start|>user\n" + strings.Repeat("word ", maxBytes/16) + "<|im_end|>"
	require.Equal(t, tok.Encode(nil, huge), pc.Encode(nil, huge))
	require.Equal(t, before, pc.bytes.Load(), "a text over a sixteenth of the budget is not cached")
}

// TestPrefixCacheCountsAncestors: documents cut every 256 bytes, each
// shared by requests that end differently, make chains a dozen entries
// deep, and more of them than MaxBytes holds: the least recently used
// entries leave first, often before their descendants. The count is
// exactly what the cached entries and their ancestors hold, and stays
// within MaxBytes.
func TestPrefixCacheCountsAncestors(t *testing.T) {
	tok := NewStandIn()
	const maxBytes = 64 << 10
	pc := NewPrefixCache(tok, PrefixCacheConfig{MaxBytes: maxBytes, CutEvery: 256})
	rng := rand.New(rand.NewPCG(7, 8))
	words := strings.Fields("alpha beta gamma delta epsilon zeta eta theta iota kappa")
	say := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteString(words[rng.IntN(len(words))] + " ")
		}
		return b.String()
	}
	docs := make([]string, 30)
	for i := range docs {
		docs[i] = fmt.Sprintf("Document %d\n", i) + say(400)
	}
	var docIDs, reused uint64
	full := false
	for i := range 600 {
		doc := docs[rng.IntN(len(docs))]
		text := "<|im_start|>user\n" + doc + say(1+rng.IntN(60)) + "<|im_end|>\n<|im_start|>assistant\n"
		before := pc.Stats().ReusedIDs
		require.Equal(t, tok.Encode(nil, text), pc.Encode(nil, text), "request %d", i)
		require.Equal(t, retained(pc), pc.bytes.Load(), "request %d", i)
		require.LessOrEqual(t, pc.bytes.Load(), int64(maxBytes), "request %d", i)
		full = full || pc.bytes.Load() > maxBytes*7/8
		docIDs += uint64(len(tok.Encode(nil, doc)))
		reused += pc.Stats().ReusedIDs - before
	}
	require.True(t, full, "the documents do not all fit")
	require.Greater(t, reused, docIDs/3, "requests reuse their document")
	pc.cache.Purge()
	require.Zero(t, pc.bytes.Load(), "nothing is alive once nothing is cached")
}

// retained sums the sizes of the entries alive: those in the cache and
// their ancestors, each once.
func retained(pc *PrefixCache) int64 {
	seen := map[*prefixEntry]bool{}
	var n int64
	for _, k := range pc.cache.Keys() {
		e, _ := pc.cache.Peek(k)
		for ; e != nil && !seen[e]; e = e.parent {
			seen[e] = true
			n += e.size()
		}
	}
	return n
}
