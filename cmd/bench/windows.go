package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/omnious/provider-node/bench/compare"
	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/internal/cli"
	"github.com/omnious/provider-node/quoter"
	"github.com/omnious/provider-node/scheduler"
)

// runWindows is `bench windows`: what the engines did at each load in
// spans of a windows file that `bench capacity -record-windows` wrote,
// side by side, so that the loads of two kinds of traffic (an open ladder
// of arrivals, a client's closed loops) can be compared.
func runWindows(args []string) error {
	fs := flag.NewFlagSet("bench windows", flag.ContinueOnError)
	file := fs.String("file", "", "windows file (DIR/windows.jsonl of bench capacity -record-windows)")
	var spans listFlag
	fs.Var(&spans, "span", "FROM:TO, seconds since the recording started (TO empty: to the end); repeat for columns side by side")
	def := capacity.DefaultObjectives
	itl := fs.Duration("slo-itl-p95", def.ITL, "inter-token objective, in the engines' time: the shares are counted against it, and a replay reads the curves at it (0: the default)")
	ttft := fs.Duration("slo-ttft-p95", def.TTFT, "time-to-first-token objective a replay reads the curves at, in the engines' time (0: the default)")
	every := fs.Duration("every", 0, "also print the fleet's load (requests in the engines) at this interval (0: not)")
	replay := fs.Int("replay", -1, "feed the windows before snapshot N's mark to fresh curves, as the EPP learnt them, and print the headroom they and snapshot-N.json (beside the file) read (negative: no replay)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cli.NonNegative(fs); err != nil {
		return fmt.Errorf("%s: %w", fs.Name(), err)
	}
	obj := capacity.Objectives{TTFT: *ttft, ITL: *itl}.WithDefaults()
	*itl = obj.ITL
	if *file == "" || fs.NArg() > 0 {
		return errors.New("bench windows: want -file and no arguments")
	}
	ss, err := parseSpans(spans)
	if err != nil {
		return err
	}
	f, err := os.Open(*file)
	if err != nil {
		return err
	}
	defer f.Close()
	q := compare.WindowQuery{Spans: ss, ITL: *itl, Every: every.Seconds()}
	if *replay >= 0 {
		q.ReplayTo, q.HalfLife = replay, *scheduler.DefaultConfig().Signals.CapacityHalfLife
	}
	st, err := compare.ReadWindows(f, q)
	if err != nil {
		return err
	}
	printWindows(os.Stdout, st, ss, *itl)
	if *replay < 0 {
		return nil
	}
	path := filepath.Join(filepath.Dir(*file), fmt.Sprintf("snapshot-%d.json", *replay))
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var snap capacity.Snapshot
	if err := json.Unmarshal(b, &snap); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	printReplay(os.Stdout, snap, st.Curves, obj)
	return nil
}

// printReplay prints, per model of snap, the headroom read from the
// snapshot's curves and from the replayed ones, per replica.
func printReplay(w io.Writer, snap capacity.Snapshot, curves map[string]capacity.Curve, o capacity.Objectives) {
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

func parseSpans(in []string) ([]compare.WindowSpan, error) {
	if len(in) == 0 {
		return []compare.WindowSpan{{}}, nil
	}
	out := make([]compare.WindowSpan, 0, len(in))
	for _, s := range in {
		from, to, ok := strings.Cut(s, ":")
		if !ok {
			return nil, fmt.Errorf("span %q is not FROM:TO", s)
		}
		var sp compare.WindowSpan
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

// windowColumns are printWindows' columns for each span after its seconds
// and inter-token share.
var windowColumns = []string{"queued", "ITL queued/free", "rising/falling", "ITL rising/falling", "new tok/s", "out tok/s", "new/out", "hits"}

func printWindows(w io.Writer, st *compare.WindowStats, spans []compare.WindowSpan, itl time.Duration) {
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
	rows := make(map[int][]*compare.WindowLoad)
	var loads []int
	for i, ls := range st.Loads {
		for j := range ls {
			l := &ls[j]
			if rows[l.Load] == nil {
				rows[l.Load] = make([]*compare.WindowLoad, len(spans))
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
