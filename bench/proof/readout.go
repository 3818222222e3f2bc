package proof

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/quoter"
)

// ReadSnapshot reads snapshot-N.json, the EPP's capacity snapshot at the
// proof's Nth quote, from beside the windows file it recorded.
func ReadSnapshot(windowsFile string, n int) (capacity.Snapshot, error) {
	var snap capacity.Snapshot
	path := filepath.Join(filepath.Dir(windowsFile), fmt.Sprintf("snapshot-%d.json", n))
	b, err := os.ReadFile(path)
	if err != nil {
		return snap, err
	}
	if err := json.Unmarshal(b, &snap); err != nil {
		return snap, fmt.Errorf("%s: %w", path, err)
	}
	return snap, nil
}

// WriteReplay prints, per model of snap, the headroom read from the
// snapshot's curves and from the replayed ones, per replica.
func WriteReplay(w io.Writer, snap capacity.Snapshot, curves map[string]capacity.Curve, o capacity.Objectives) {
	for _, m := range snap.Models {
		_, saved := quoter.ComputeHeadroom(m, nil, o)
		replayed := m
		replayed.ReplicaCapacity = slices.Clone(m.ReplicaCapacity)
		for i := range replayed.ReplicaCapacity {
			replayed.ReplicaCapacity[i].Curve = curves[replayed.ReplicaCapacity[i].Addr]
		}
		_, again := quoter.ComputeHeadroom(replayed, nil, o)
		fmt.Fprintf(w, "%s: streams %.1f from the snapshot's curves, %.1f replayed; capacity %.0f and %.0f tok/s\n",
			m.Model, saved.Streams, again.Streams, saved.OutputTokensPerSec, again.OutputTokensPerSec)
		for i, a := range again.Replicas {
			s := saved.Replicas[i]
			fmt.Fprintf(w, "  %s  streams %.2f / %.2f  limit %s / %s\n", a.Addr, s.Capacity.Streams, a.Capacity.Streams, s.Capacity.Limit, a.Capacity.Limit)
		}
		// The healthy replicas' curves added together, read as one engine's:
		// whether the sum of the replicas' own readings loses to the noise of
		// each replica's windows.
		var healthy []capacity.Curve
		for _, r := range m.ReplicaCapacity {
			if r.Healthy {
				healthy = append(healthy, r.Curve)
			}
		}
		pooled, _ := capacity.Pool(healthy)
		if at, err := pooled.At(o); err == nil {
			fmt.Fprintf(w, "  pooled: streams %.2f an engine, %.1f for %d replicas (the objectives alone, no admission or KV bound)\n",
				at.Streams, at.Streams*float64(len(healthy)), len(healthy))
		}
	}
}

// ParseSpans reads FROM:TO spans, in seconds since the recording started
// (TO empty: to the end); none is the whole recording.
func ParseSpans(in []string) ([]WindowSpan, error) {
	if len(in) == 0 {
		return []WindowSpan{{}}, nil
	}
	out := make([]WindowSpan, 0, len(in))
	for _, s := range in {
		from, to, ok := strings.Cut(s, ":")
		if !ok {
			return nil, fmt.Errorf("span %q is not FROM:TO", s)
		}
		var sp WindowSpan
		var err error
		if sp.From, err = strconv.ParseFloat(from, 64); err != nil || sp.From < 0 {
			return nil, fmt.Errorf("span %q: FROM is not a number of seconds", s)
		}
		if to != "" {
			if sp.To, err = strconv.ParseFloat(to, 64); err != nil || sp.To <= sp.From {
				return nil, fmt.Errorf("span %q: TO is not a number of seconds after FROM", s)
			}
		}
		out = append(out, sp)
	}
	return out, nil
}

// windowColumns are WriteTable's columns for each span after its seconds
// and inter-token share.
var windowColumns = []string{"queued", "ITL queued/free", "rising/falling", "ITL rising/falling", "new tok/s", "out tok/s", "new/out", "hits"}

// WriteTable prints the snapshots' marks, the load series (WindowQuery's
// Every) and a table of what the engines did at each load, one row a
// load, each span's columns side by side (a dash where a span never ran at
// that load); the inter-token shares are counted against itl.
func (st *WindowStats) WriteTable(w io.Writer, spans []WindowSpan, itl time.Duration) {
	for _, m := range st.Marks {
		fmt.Fprintf(w, "snapshot-%d.json at %.0f s\n", m.Snapshot, m.Seconds)
	}
	for _, p := range st.Series {
		fmt.Fprintf(w, "%6.0f s  load %6.1f\n", p[0], p[1])
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "load\t")
	for _, s := range spans {
		to := "end"
		if s.To > 0 {
			to = fmt.Sprintf("%.0f", s.To)
		}
		fmt.Fprintf(tw, "%.0f-%s s\tITL<=%v\t%s\t", s.From, to, itl, strings.Join(windowColumns, "\t"))
	}
	fmt.Fprintln(tw)
	rows := make(map[int][]*WindowLoad)
	var loads []int
	for i, ls := range st.Loads {
		for j := range ls {
			l := &ls[j]
			if rows[l.Load] == nil {
				rows[l.Load] = make([]*WindowLoad, len(spans))
				loads = append(loads, l.Load)
			}
			rows[l.Load][i] = l
		}
	}
	slices.Sort(loads)
	for _, k := range loads {
		fmt.Fprintf(tw, "%d\t", k)
		for _, l := range rows[k] {
			if l == nil {
				fmt.Fprint(tw, strings.Repeat("-\t", 2+len(windowColumns)))
				continue
			}
			ratio := "-"
			if l.OutputTokensPerSec > 0 {
				ratio = fmt.Sprintf("%.1f", l.NewTokensPerSec/l.OutputTokensPerSec)
			}
			fmt.Fprintf(tw, "%.0f\t%.3f\t%.2f\t%.3f/%.3f\t%.2f/%.2f\t%.3f/%.3f\t%.0f\t%.0f\t%s\t%.2f\t", l.Seconds, l.ITLWithin, l.Queued, l.ITLWithinQueued, l.ITLWithinFree,
				l.Rising, l.Falling, l.ITLWithinRising, l.ITLWithinFalling, l.NewTokensPerSec, l.OutputTokensPerSec, ratio, l.PrefixHitRate())
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
}
