package proof

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/quoter"
)

func TestParseSpans(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []WindowSpan
		err  string
	}{
		{nil, []WindowSpan{{}}, ""},
		{[]string{"0:1902", "3240:"}, []WindowSpan{{From: 0, To: 1902}, {From: 3240}}, ""},
		{[]string{"12"}, nil, "not FROM:TO"},
		{[]string{"x:3"}, nil, "FROM is not"},
		{[]string{"-1:3"}, nil, "FROM is not"},
		{[]string{"5:5"}, nil, "TO is not"},
		{[]string{"5:y"}, nil, "TO is not"},
	} {
		got, err := ParseSpans(tc.in)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.in)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, tc.want, got)
	}
}

// TestWriteReplay: the headroom read from the snapshot's curves and from
// the replayed ones, per replica, and the healthy replicas' curves pooled
// into one engine's, read alone.
func TestWriteReplay(t *testing.T) {
	l := capacity.NewLearner(time.Hour)
	bounds := []float64{0.05, 0.1}
	for range 20 {
		for _, w := range []struct{ load, within float64 }{{2, 100}, {4, 96}, {6, 80}} {
			l.Add(capacity.Window{Seconds: 1, Running: w.load, ConcurrencyNow: w.load, OutputTokensPerSec: 100 * w.load,
				ITLBounds: bounds, ITL: capacity.Histogram{Counts: []float64{w.within, 100}, Count: 100}})
		}
	}
	c := l.Curve()
	o := quoter.Config{}.WithDefaults().Objectives
	one, err := c.At(o)
	require.NoError(t, err)
	require.Greater(t, one.Streams, 2.0)
	snap := capacity.Snapshot{Models: []capacity.Model{{Model: "m", ReplicaCapacity: []capacity.Replica{
		{Addr: "a", Healthy: true, Curve: c},
		{Addr: "b", Healthy: true, Curve: c},
		{Addr: "c", Curve: c}, // not healthy: sells nothing, pools nothing
	}}}}
	var b strings.Builder
	WriteReplay(&b, snap, map[string]capacity.Curve{"a": c, "b": c, "c": c}, o)
	out := b.String()
	require.Contains(t, out, fmt.Sprintf("m: streams %.1f from the snapshot's curves, %.1f replayed", 2*one.Streams, 2*one.Streams))
	require.Contains(t, out, fmt.Sprintf("  a  streams %.2f / %.2f  limit", one.Streams, one.Streams))
	require.Contains(t, out, fmt.Sprintf("  pooled: streams %.2f an engine, %.1f for 2 replicas", one.Streams, 2*one.Streams))
}

// TestWriteWindowsTable: one row a load, each span's columns side by side, a
// dash for every column of a span that never ran at that load.
func TestWriteWindowsTable(t *testing.T) {
	st := &WindowStats{Loads: [][]WindowLoad{
		{{Load: 3, Seconds: 10, ITLWithin: 0.9, Queued: 0.25, ITLWithinQueued: 0.5, ITLWithinFree: 1, Rising: 0.4, Falling: 0.1,
			ITLWithinRising: 0.75, ITLWithinFalling: 1, NewTokensPerSec: 200, OutputTokensPerSec: 100, PromptTokensPerSec: 1000}},
		{},
	}}
	var b strings.Builder
	st.WriteTable(&b, []WindowSpan{{From: 0, To: 60}, {From: 60}}, 50*time.Millisecond)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	require.Len(t, lines, 2)
	require.Equal(t, []string{"load", "0-60", "s", "ITL<=50ms", "queued", "ITL", "queued/free", "rising/falling", "ITL", "rising/falling",
		"new", "tok/s", "out", "tok/s", "new/out", "hits"}, strings.Fields(lines[0])[:16])
	require.Equal(t, append([]string{"3", "10", "0.900", "0.25", "0.500/1.000", "0.40/0.10", "0.750/1.000", "200", "100", "2.0", "0.80"},
		strings.Fields(strings.Repeat("- ", 10))...), strings.Fields(lines[1]))
}
