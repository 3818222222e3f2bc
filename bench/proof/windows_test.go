package proof

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/capacity"
)

// A recorded file reads back as the windows and marks written, in order.
func TestWindowRecorder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "windows.jsonl")
	r, err := newWindowRecorder(path)
	require.NoError(t, err)
	w := capacity.Window{Seconds: 0.25, Running: 3, ITLBounds: []float64{0.05}, ITL: capacity.Histogram{Counts: []float64{7}, Count: 9, Sum: 0.6}}
	r.window("127.0.0.1:1", w)
	r.snapshot(0)
	r.window("127.0.0.1:2", w)
	require.NoError(t, r.Close())

	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var recs []windowRecord
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var rec windowRecord
		require.NoError(t, json.Unmarshal(sc.Bytes(), &rec))
		recs = append(recs, rec)
	}
	require.NoError(t, sc.Err())
	require.Len(t, recs, 3)
	require.Equal(t, "127.0.0.1:1", recs[0].Addr)
	require.Equal(t, w, *recs[0].Window)
	require.Nil(t, recs[0].Snapshot)
	require.Equal(t, 0, *recs[1].Snapshot)
	require.Nil(t, recs[1].Window)
	require.Equal(t, "127.0.0.1:2", recs[2].Addr)
	require.LessOrEqual(t, recs[0].Seconds, recs[2].Seconds)
}

// ReadWindows sums each span's windows by load: shares by observation,
// rates by time; idle windows and those outside a span count nowhere.
func TestReadWindows(t *testing.T) {
	bounds := []float64{0.025, 0.05, 0.1}
	win := func(running, waiting, newTok, prompt, out float64, within, count float64) *capacity.Window {
		return &capacity.Window{Seconds: 1, Running: running, Waiting: waiting, NewPromptTokensPerSec: newTok, PromptTokensPerSec: prompt,
			OutputTokensPerSec: out, ITLBounds: bounds, ITL: capacity.Histogram{Counts: []float64{0, within, count}, Count: count}}
	}
	mark := func(n int) *int { return &n }
	recs := []windowRecord{
		{Seconds: 1, Addr: "a", Window: win(3, 1, 100, 1000, 50, 90, 100)},
		{Seconds: 2, Addr: "b", Window: win(4, 0, 300, 1000, 150, 30, 100)},
		{Seconds: 3, Addr: "a", Window: win(0, 0, 0, 0, 0, 0, 0)}, // idle
		{Seconds: 4, Snapshot: mark(0)},
		{Seconds: 5, Addr: "a", Window: win(9, 0, 500, 500, 20, 10, 10)},
		{Seconds: 6, Addr: "b", Window: win(1, 0, 0, 0, 30, 20, 40)},
	}
	var b strings.Builder
	enc := json.NewEncoder(&b)
	for _, r := range recs {
		require.NoError(t, enc.Encode(r))
	}
	st, err := ReadWindows(strings.NewReader(b.String()), WindowQuery{Spans: []WindowSpan{{0, 4}, {4, 0}}, ITL: 50 * time.Millisecond, Every: 1,
		ReplayTo: mark(0)})
	require.NoError(t, err)
	require.Equal(t, []WindowMark{{Seconds: 4, Snapshot: 0}}, st.Marks)
	require.Equal(t, [][2]float64{{1, 4}, {2, 8}, {3, 4}, {5, 13}, {6, 10}}, st.Series)
	require.Len(t, st.Loads, 2)
	require.Len(t, st.Loads[0], 1)
	l := st.Loads[0][0]
	require.Equal(t, 4, l.Load)
	require.Equal(t, 2.0, l.Seconds)
	require.InDelta(t, 0.6, l.ITLWithin, 1e-9)
	require.InDelta(t, 200, l.NewTokensPerSec, 1e-9)
	require.InDelta(t, 100, l.OutputTokensPerSec, 1e-9)
	require.InDelta(t, 0.8, l.PrefixHitRate(), 1e-9)
	// a's window had a prompt waiting, b's none.
	require.InDelta(t, 0.5, l.Queued, 1e-9)
	require.InDelta(t, 0.9, l.ITLWithinQueued, 1e-9)
	require.InDelta(t, 0.3, l.ITLWithinFree, 1e-9)
	// Neither replica had a load TrendSpan before its first window.
	require.Zero(t, l.Rising)
	require.Zero(t, l.Falling)
	// After the mark a's load rose from its idle window's 0 to 9, and b's
	// fell from 4 to 1.
	require.Equal(t, []WindowLoad{
		{Load: 1, Seconds: 1, ITLWithin: 0.5, OutputTokensPerSec: 30, ITLWithinQueued: 1, ITLWithinFree: 0.5,
			Falling: 1, ITLWithinRising: 1, ITLWithinFalling: 0.5},
		{Load: 9, Seconds: 1, ITLWithin: 1, NewTokensPerSec: 500, OutputTokensPerSec: 20, PromptTokensPerSec: 500,
			ITLWithinQueued: 1, ITLWithinFree: 1, Rising: 1, ITLWithinRising: 1, ITLWithinFalling: 1},
	}, st.Loads[1])
	// The replay stops at the mark: a's curve holds its busy window at 4
	// requests, not the one at 9 after the mark.
	require.Len(t, st.Curves, 2)
	require.Len(t, st.Curves["a"].Bins, 1)
	require.Equal(t, 4.0, st.Curves["a"].Bins[0].Concurrency)
	_, err = ReadWindows(strings.NewReader(b.String()), WindowQuery{ReplayTo: mark(1)})
	require.ErrorContains(t, err, "no mark for snapshot-1.json")

	_, err = ReadWindows(strings.NewReader(b.String()+"{garbage\n"), WindowQuery{})
	require.ErrorContains(t, err, "windows line 7")
	_, err = ReadWindows(strings.NewReader("{\"t\":1}\n"), WindowQuery{})
	require.ErrorContains(t, err, "neither a window nor a mark")
}
