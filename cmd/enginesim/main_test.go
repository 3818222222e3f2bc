package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/sim/simtest"
	"github.com/omnious/provider-node/internal/testutil/freeport"
)

// freePortPair returns a port p such that p and p+1 are both free (a
// second data-parallel rank listens on port+1).
func freePortPair(t *testing.T) int {
	t.Helper()
	for range 100 {
		ports, err := freeport.Take(1)
		require.NoError(t, err)
		b, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", ports[0]+1))
		if err == nil {
			b.Close()
			return ports[0]
		}
	}
	t.Fatal("no two consecutive free ports on 127.0.0.1")
	return 0
}

func postJSON(t *testing.T, url string, body any) (int, []byte) {
	t.Helper()
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	resp, err := http.Post(url, "application/json", bytes.NewReader(raw))
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, out
}

// lines collects a process's stdout lines as they come.
type lines struct {
	mu  sync.Mutex
	all []string
}

func (l *lines) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		l.mu.Lock()
		l.all = append(l.all, sc.Text())
		l.mu.Unlock()
	}
}

func (l *lines) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.all...)
}

// TestPythonSubscriberDecodesEnginesim runs the real binary with two
// data-parallel ranks and an independent Python subscriber (pyzmq and
// msgpack, not our Go decoder) on rank 1: it decodes the events, fills a
// forced gap by replay, and sees the restart's AllBlocksCleared.
func TestPythonSubscriberDecodesEnginesim(t *testing.T) {
	bin := simtest.Binary(t)
	for _, flavour := range []string{"vllm", "sglang"} {
		t.Run(flavour, func(t *testing.T) {
			httpPort, pubPort, replayPort := freePortPair(t), freePortPair(t), freePortPair(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			sim := exec.CommandContext(ctx, bin, "-engine", flavour, "-data-parallel-size", "2",
				"-listen", fmt.Sprintf("127.0.0.1:%d", httpPort),
				"-kv-events-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", pubPort),
				"-kv-events-replay-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", replayPort),
				"-time-scale", "100", "-log-level", "warn")
			sim.Stderr = os.Stderr
			require.NoError(t, sim.Start())
			defer func() { _ = sim.Process.Kill(); _ = sim.Wait() }()
			base := fmt.Sprintf("http://127.0.0.1:%d", httpPort+1)
			simtest.WaitOK(t, base+"/health")

			py := exec.CommandContext(ctx, "/usr/bin/python3", "../../engines/kvevents/testdata/pysub.py",
				"--endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", pubPort+1),
				"--replay", fmt.Sprintf("tcp://127.0.0.1:%d", replayPort+1), "--timeout", "20")
			var stderr bytes.Buffer
			py.Stderr = &stderr
			stdout, err := py.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, py.Start(), "needs Debian's python3-zmq and python3-msgpack (make deps)")
			out := &lines{}
			readDone := make(chan struct{})
			go func() { defer close(readDone); out.read(stdout) }()

			complete := func(prompt string) {
				code, body := postJSON(t, base+"/v1/completions", map[string]any{"model": "Qwen/Qwen3-32B", "prompt": prompt, "max_tokens": 2})
				require.Equal(t, http.StatusOK, code, string(body))
			}
			probe := 0
			require.Eventually(t, func() bool {
				probe++
				complete(strings.Repeat(fmt.Sprintf("probe %d ", probe), 30))
				return len(out.snapshot()) > 0
			}, 10*time.Second, 50*time.Millisecond, "python subscriber receives events; stderr: %s", &stderr)

			code, _ := postJSON(t, base+"/admin/drop-events", map[string]any{"batches": 2})
			require.Equal(t, http.StatusOK, code)
			for i := 0; i < 4; i++ {
				complete(strings.Repeat(fmt.Sprintf("after the gap %d ", i), 30))
			}
			// The restart below empties the replay buffer: the subscriber
			// must have filled the gap from it first.
			require.Eventually(t, func() bool {
				n := 0
				for _, l := range out.snapshot() {
					if strings.Contains(l, `"source": "replay"`) {
						n++
					}
				}
				return n >= 2
			}, 10*time.Second, 20*time.Millisecond, "the dropped batches are replayed; stderr: %s", &stderr)
			resp, err := http.Get(base + "/admin/blocks")
			require.NoError(t, err)
			var view struct {
				Blocks []struct{ Hash uint64 } `json:"blocks"`
			}
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&view))
			resp.Body.Close()
			resident := map[uint64]bool{}
			for _, b := range view.Blocks {
				resident[b.Hash] = true
			}
			code, _ = postJSON(t, base+"/admin/restart", map[string]any{})
			require.Equal(t, http.StatusOK, code)
			// The restart's AllBlocksCleared makes the script exit 0. A
			// batch after it is what tells a subscriber the sequence reset.
			complete(strings.Repeat("after the restart ", 30))
			require.NoError(t, py.Wait(), "python subscriber failed: %s", &stderr)
			<-readDone

			type pyBatch struct {
				Seq    uint64 `json:"seq"`
				Source string `json:"source"`
				DPRank *int   `json:"dp_rank"`
				Events []struct {
					Type        string   `json:"type"`
					BlockHashes []uint64 `json:"block_hashes"`
					TokenIDs    []uint32 `json:"token_ids"`
					BlockSize   int      `json:"block_size"`
				} `json:"events"`
			}
			var batches []pyBatch
			for _, l := range out.snapshot() {
				var b pyBatch
				require.NoError(t, json.Unmarshal([]byte(l), &b), l)
				batches = append(batches, b)
			}
			replayed, cleared, restarted, stored := 0, false, false, 0
			for i, b := range batches {
				if b.Source == "restart" {
					restarted = true
					continue
				}
				if i > 0 && !restarted {
					require.Equal(t, batches[i-1].Seq+1, b.Seq, "contiguous sequence")
				}
				require.NotNil(t, b.DPRank)
				require.Equal(t, 1, *b.DPRank, "rank 1's publisher says so")
				if b.Source == "replay" {
					replayed++
				}
				for _, ev := range b.Events {
					switch ev.Type {
					case "BlockStored":
						require.Equal(t, 16, ev.BlockSize)
						require.Len(t, ev.TokenIDs, 16*len(ev.BlockHashes))
						for _, h := range ev.BlockHashes {
							// Blocks stored after the restart's clear (the
							// publisher may batch them with it) postdate
							// the resident set read before it.
							require.True(t, cleared || resident[h], "a block the python subscriber decoded is resident in the simulator")
							stored++
						}
					case "AllBlocksCleared":
						cleared = true
					}
				}
			}
			// Replay returns everything buffered from the gap on, so batches
			// after the dropped two may come back that way too.
			require.GreaterOrEqual(t, replayed, 2, "the two dropped batches came back by replay")
			require.True(t, restarted, "the sequence going down was seen")
			require.True(t, cleared)
			require.Positive(t, stored)
		})
	}
}
