package kvevents

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// pythonBin is Debian's interpreter, which has python3-zmq and
// python3-msgpack; a pyenv python3 on PATH usually has neither.
const pythonBin = "/usr/bin/python3"

type pyEvent struct {
	Type        string   `json:"type"`
	BlockHashes []uint64 `json:"block_hashes"`
	Parent      *uint64  `json:"parent"`
	TokenIDs    []uint32 `json:"token_ids"`
	BlockSize   int      `json:"block_size"`
	Medium      *string  `json:"medium"`
}

type pyBatch struct {
	Seq    uint64    `json:"seq"`
	Source string    `json:"source"`
	TS     float64   `json:"ts"`
	DPRank *int      `json:"dp_rank"`
	Events []pyEvent `json:"events"`
}

// TestPythonSubscriberInterop checks the publisher against libzmq and
// msgpack-python: live batches, a forced gap filled by a DEALER replay, and
// every block's content. It fails when the Python modules are missing.
func TestPythonSubscriberInterop(t *testing.T) {
	out, err := exec.Command(pythonBin, "-c", "import zmq, msgpack").CombinedOutput()
	require.NoError(t, err, "need %s with python3-zmq and python3-msgpack: %s", pythonBin, out)

	tests := []struct {
		name   string
		format Format
		hash   HashEncoding
		layout ReplayLayout
	}{
		{"vLLM 0.26 map bytes topic-seq", FormatMap, HashBytes, ReplayLayoutTopicSeq},
		{"vLLM legacy array uint64 seq", FormatArray, HashUint64, ReplayLayoutSeq},
		{"SGLang array int64 seq", FormatArraySGLang, HashInt64, ReplayLayoutSeq},
		{"SGLang 0.5.23 map int64 topic-seq", FormatMapSGLang, HashInt64, ReplayLayoutTopicSeq},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startPublisher(t, PublisherConfig{
				Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", ReplayLayout: tt.layout,
				Topic: "kv-events", Format: tt.format, HashEncoding: tt.hash, DPRank: 1,
			})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, pythonBin, "testdata/pysub.py",
				"--endpoint", p.Endpoint(), "--replay", p.ReplayEndpoint(), "--topic", "kv", "--timeout", "20")
			stderr := &syncBuffer{}
			cmd.Stderr = stderr
			stdout, err := cmd.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			lines := make(chan pyBatch, 1024)
			parseErr := make(chan error, 1)
			go func() {
				defer close(lines)
				sc := bufio.NewScanner(stdout)
				sc.Buffer(make([]byte, 1<<20), 1<<20)
				for sc.Scan() {
					var b pyBatch
					if err := json.Unmarshal(sc.Bytes(), &b); err != nil {
						parseErr <- err
						return
					}
					lines <- b
				}
			}()

			// Probe until the script is subscribed, then drain to the last probe.
			var base uint64
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
		probe:
			for {
				seq, err := p.Publish(storedEvent(hashFor(0, 0)))
				require.NoError(t, err)
				select {
				case b, ok := <-lines:
					require.True(t, ok, "script exited: %s", stderr.String())
					for b.Seq < seq {
						b, ok = <-lines
						require.True(t, ok, "script exited: %s", stderr.String())
					}
					base = seq
					break probe
				case <-tick.C:
				case <-ctx.Done():
					t.Fatalf("script never subscribed: %s", stderr.String())
				}
			}

			want := map[uint64][]Event{}
			var last uint64
			for i := 1; i <= 12; i++ {
				if i == 5 {
					p.DropNext(4)
				}
				evs := []Event{{
					Kind: KindBlockStored, BlockHashes: []uint64{hashFor(7, i), hashFor(8, i)}, ParentHash: hashFor(9, i), HasParent: i%2 == 0,
					TokenIDs: []uint32{uint32(i), 70000, 3, 4}, BlockSize: 2, Medium: "GPU",
				}, {Kind: KindBlockRemoved, BlockHashes: []uint64{hashFor(10, i)}, Medium: "CPU"}}
				if i == 12 {
					evs = append(evs, Event{Kind: KindAllBlocksCleared})
				}
				seq, err := p.Publish(evs)
				require.NoError(t, err)
				want[seq], last = evs, seq
			}

			var got []pyBatch
			for b := range lines {
				got = append(got, b)
			}
			select {
			case err := <-parseErr:
				require.NoError(t, err)
			default:
			}
			require.NoError(t, cmd.Wait(), "stderr: %s", stderr.String())

			require.Len(t, got, int(last-base), "stderr: %s", stderr.String())
			replayed := 0
			for i, b := range got {
				require.Equal(t, base+1+uint64(i), b.Seq)
				if b.Source == "replay" {
					replayed++
				}
				require.NotNil(t, b.DPRank)
				require.Equal(t, 1, *b.DPRank)
				evs := want[b.Seq]
				require.Len(t, b.Events, len(evs), "seq %d", b.Seq)
				for j, ev := range evs {
					pe := b.Events[j]
					require.Equal(t, ev.Kind.String(), pe.Type)
					if ev.Kind == KindAllBlocksCleared {
						continue
					}
					require.Equal(t, ev.BlockHashes, pe.BlockHashes, "seq %d event %d", b.Seq, j)
					require.NotNil(t, pe.Medium)
					require.Equal(t, ev.Medium, *pe.Medium)
					if ev.Kind == KindBlockStored {
						require.Equal(t, ev.TokenIDs, pe.TokenIDs)
						require.Equal(t, ev.BlockSize, pe.BlockSize)
						if ev.HasParent {
							require.NotNil(t, pe.Parent)
							require.Equal(t, ev.ParentHash, *pe.Parent)
						} else {
							require.Nil(t, pe.Parent)
						}
					}
				}
			}
			require.GreaterOrEqual(t, replayed, 4, "the dropped batches must come from the replay")
		})
	}
}

// syncBuffer lets the test read the script's stderr while exec writes it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestGoSubscriberWithPythonPublisher runs the Subscriber against a libzmq
// publisher and ROUTER fed by msgpack-python in every wire shape, with a
// gap that the Subscriber must fill by replay.
func TestGoSubscriberWithPythonPublisher(t *testing.T) {
	out, err := exec.Command(pythonBin, "-c", "import zmq, msgpack").CombinedOutput()
	require.NoError(t, err, "need %s with python3-zmq and python3-msgpack: %s", pythonBin, out)

	for _, layout := range []string{"seq", "topic-seq"} {
		t.Run(layout, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, pythonBin, "testdata/pypub.py", "--layout", layout)
			stderr := &syncBuffer{}
			cmd.Stderr = stderr
			stdin, err := cmd.StdinPipe()
			require.NoError(t, err)
			stdout, err := cmd.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			defer func() {
				_ = stdin.Close()
				require.NoError(t, cmd.Wait(), "stderr: %s", stderr.String())
			}()
			sc := bufio.NewScanner(stdout)
			require.True(t, sc.Scan(), "no endpoints: %s", stderr.String())
			var eps struct{ Pub, Replay string }
			require.NoError(t, json.Unmarshal(sc.Bytes(), &eps))

			rec := &recorder{}
			s := startSubscriber(t, SubscriberConfig{Endpoint: eps.Pub, ReplayEndpoint: eps.Replay, Topic: "kv"}, rec)
			require.Eventually(t, func() bool { bs, _ := rec.snapshot(); return len(bs) > 0 }, 20*time.Second, 10*time.Millisecond,
				"no probe arrived: %s", stderr.String())
			_, err = stdin.Write([]byte("go\n"))
			require.NoError(t, err)
			require.True(t, sc.Scan(), "no expectations: %s", stderr.String())
			var exp struct {
				Expect []struct {
					Seq    uint64
					Hashes []uint64
				}
			}
			require.NoError(t, json.Unmarshal(sc.Bytes(), &exp))
			require.Len(t, exp.Expect, 12)
			last := exp.Expect[len(exp.Expect)-1].Seq
			rec.waitSeq(t, "kv-events", last)

			bs, resets := rec.snapshot()
			require.Empty(t, resets)
			byseq := map[uint64][]uint64{}
			for _, b := range bs {
				_, dup := byseq[b.seq]
				require.False(t, dup, "seq %d delivered twice", b.seq)
				byseq[b.seq] = b.hashes
			}
			for _, e := range exp.Expect {
				require.Equal(t, e.Hashes, byseq[e.Seq], "seq %d", e.Seq)
			}
			// Batches replayed at start carry the topic only in the
			// topic-seq layout: check them whatever their topic.
			requireContiguous(t, bs, "*", bs[0].seq, last, nil)
			require.Equal(t, uint64(1), s.Stats().Gaps.Load())
			require.Equal(t, uint64(1), s.Stats().Replays.Load())
			require.Zero(t, s.Stats().DroppedDecode.Load())
		})
	}
}
