package tokenizer

import (
	"bufio"
	"encoding/json"
	"io"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/internal/cputime"
	"github.com/omnious/provider-node/internal/testutil/pyenv"
)

// vsHFFamilies are the families BenchmarkTokenizeVsHF measures.
var vsHFFamilies = []string{"qwen3", "llama3_1", "deepseek_v3", "gptoss"}

// hfEncoder is Hugging Face tokenizers (the library vLLM and SGLang
// tokenize with), from the pinned vLLM Python environment, in a child
// process that testdata/hf/encode.py drives.
type hfEncoder struct {
	cmd     *exec.Cmd
	in      io.WriteCloser
	out     *bufio.Scanner
	version string
	once    sync.Once
}

type hfReply struct {
	CPUNs   int64    `json:"cpu_ns"`
	WallNs  int64    `json:"wall_ns"`
	IDs     []uint32 `json:"ids"`
	Version string   `json:"version"`
}

// startHF starts encode.py on a family's tokenizer.json; b's cleanup ends
// it. A missing environment fails b with the command that installs it.
func startHF(b *testing.B, fam string) *hfEncoder {
	b.Helper()
	py := pyenv.MustPython(b, "vllm")
	cmd := exec.Command(py, filepath.Join("testdata", "hf", "encode.py"), filepath.Join(modelDir(fam), "tokenizer.json"))
	in, err := cmd.StdinPipe()
	require.NoError(b, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(b, err)
	require.NoError(b, cmd.Start(), "cannot start %s", py)
	h := &hfEncoder{cmd: cmd, in: in, out: bufio.NewScanner(stdout)}
	b.Cleanup(h.stop)
	h.out.Buffer(make([]byte, 1<<20), 64<<20)
	h.version = h.read(b).Version
	require.NotEmpty(b, h.version, "encode.py did not report its tokenizers version")
	return h
}

// stop ends the child: closing its input ends its loop; it is killed by
// its PID if it does not exit by itself.
func (h *hfEncoder) stop() {
	h.once.Do(func() {
		h.in.Close()
		done := make(chan struct{})
		go func() { h.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			h.cmd.Process.Kill()
			<-done
		}
	})
}

func (h *hfEncoder) read(b *testing.B) hfReply {
	b.Helper()
	if !h.out.Scan() {
		b.Fatalf("HF encoder ended: %v", h.out.Err())
	}
	var r hfReply
	require.NoError(b, json.Unmarshal(h.out.Bytes(), &r))
	return r
}

// encode has HF tokenizers encode text, emptying its word cache first when
// cold, and returns its CPU time (and its ids when asked).
func (h *hfEncoder) encode(b *testing.B, text string, cold, ids bool) hfReply {
	b.Helper()
	req, err := json.Marshal(map[string]any{"text": text, "cold": cold, "ids": ids})
	require.NoError(b, err)
	_, err = h.in.Write(append(req, '\n'))
	require.NoError(b, err)
	return h.read(b)
}

// BenchmarkTokenizeVsHF measures this tokenizer and HF tokenizers side by
// side, both cold (word caches emptied before every pass), on each corpus
// document of the four families: each iteration encodes the document with
// both, so both see the same machine load. It reports both CPU throughputs
// and their ratio (x-hf, the target is >= 10), and fails if the ids differ.
func BenchmarkTokenizeVsHF(b *testing.B) {
	for _, fam := range vsHFFamilies {
		tok := loadFamily(b, fam)
		docs := goldenCorpus(b, fam)
		hf := startHF(b, fam)
		for _, script := range corpusScripts {
			text := docs[script].Text
			b.Run(fam+"/"+script, func(b *testing.B) {
				// Both sides once untimed: ids compared, code paths warm.
				fresh := *tok
				want := hf.encode(b, text, true, true).IDs
				dst := fresh.Encode(nil, text)
				require.True(b, equalIDs(dst, want), "%s %s: ids differ from HF tokenizers %s at %d", fam, script, hf.version, firstDiff(dst, want))
				b.SetBytes(int64(len(text)))
				var goCPU, hfCPU int64
				for b.Loop() {
					fresh.cache = newWordCache()
					c0, _ := cputime.Now()
					dst = fresh.Encode(dst[:0], text)
					c1, _ := cputime.Now()
					goCPU += int64(c1 - c0)
					hfCPU += hf.encode(b, text, true, false).CPUNs
				}
				if goCPU > 0 && hfCPU > 0 {
					n := float64(b.N) * float64(len(text))
					b.ReportMetric(n/float64(goCPU)*1e3, "go-cpu-MB/s")
					b.ReportMetric(n/float64(hfCPU)*1e3, "hf-cpu-MB/s")
					b.ReportMetric(float64(hfCPU)/float64(goCPU), "x-hf")
				}
				b.ReportMetric(float64(len(dst)), "tokens/op")
			})
		}
		hf.stop()
	}
}
