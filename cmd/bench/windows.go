package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/omnious/provider-node/bench/proof"
	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/internal/cli"
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
	ss, err := proof.ParseSpans(spans)
	if err != nil {
		return err
	}
	f, err := os.Open(*file)
	if err != nil {
		return err
	}
	defer f.Close()
	q := proof.WindowQuery{Spans: ss, ITL: *itl, Every: every.Seconds()}
	if *replay >= 0 {
		q.ReplayTo, q.HalfLife = replay, *scheduler.DefaultConfig().Signals.CapacityHalfLife
	}
	st, err := proof.ReadWindows(f, q)
	if err != nil {
		return err
	}
	st.WriteTable(os.Stdout, ss, *itl)
	if *replay < 0 {
		return nil
	}
	snap, err := proof.ReadSnapshot(*file, *replay)
	if err != nil {
		return err
	}
	proof.WriteReplay(os.Stdout, snap, st.Curves, obj)
	return nil
}
