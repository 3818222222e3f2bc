package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/internal/opt"
	"github.com/omnious/provider-node/quoter"
)

// headroomReport is one model's line of `quoter headroom`.
type headroomReport struct {
	Model        string            `json:"model"`
	TokensPerSec uint64            `json:"headroom_tokens_per_sec"`
	Concurrency  uint32            `json:"headroom_concurrency"`
	Calibration  bool              `json:"calibration"`
	Assessment   quoter.Assessment `json:"assessment"`
}

// cmdHeadroom reads a capacity snapshot at the objectives and prints, per
// model, the headroom a quote would offer and how it was reached, without
// signing or checking health: the EPP's live /v1/capacity, or one saved
// earlier (`bench capacity -dir` keeps one at each quote), to see why a
// quote read what it did.
func cmdHeadroom(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("headroom", stderr)
	var f capacityFlags
	f.register(fs, quoter.Config{}.WithDefaults())
	snapFile := fs.String("snapshot", "", "a saved /v1/capacity document to read instead of --capacity-url")
	model := fs.String("model", env("MODEL_ID", ""), "model to read (env MODEL_ID; empty: every model in the snapshot)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	o := f.objectives().WithDefaults()
	if err := errors.Join(envDurationErrors(), opt.DefaultNonNegative("--slo-ttft-p95", o.TTFT, capacity.DefaultObjectives.TTFT),
		opt.DefaultNonNegative("--slo-itl-p95", o.ITL, capacity.DefaultObjectives.ITL)); err != nil {
		fmt.Fprintln(stderr, "quoter headroom:", err)
		return exitUsage
	}
	if fs.NArg() > 0 || (f.capacityURL == "") == (*snapFile == "") {
		fmt.Fprintln(stderr, "quoter headroom: give one of --capacity-url or --snapshot")
		return exitUsage
	}
	var snap capacity.Snapshot
	if *snapFile != "" {
		b, err := os.ReadFile(*snapFile)
		if err == nil {
			err = json.Unmarshal(b, &snap)
		}
		if err != nil {
			fmt.Fprintf(stderr, "quoter headroom: snapshot %s: %v\n", *snapFile, err)
			return exitFail
		}
	} else {
		var err error
		hc, herr := adminClient(f.admin, 5*time.Second)
		if herr != nil {
			fmt.Fprintln(stderr, "quoter headroom:", herr)
			return exitUsage
		}
		if snap, err = (&quoter.CapacityClient{URL: f.capacityURL, HTTP: hc}).Fetch(ctx); err != nil {
			fmt.Fprintln(stderr, "quoter headroom:", err)
			return exitFail
		}
	}
	var cal *capacity.Calibration
	if f.calibrationFile != "" {
		c, err := capacity.LoadCalibration(f.calibrationFile)
		if err != nil {
			// As the quote loop does: an unusable calibration leaves
			// what the replicas measured online.
			fmt.Fprintf(stderr, "quoter headroom: calibration unusable, reading capacity measured online only: %v\n", err)
		}
		cal = c
	}
	var out []headroomReport
	for _, m := range snap.Models {
		if *model != "" && m.Model != *model {
			continue
		}
		c := cal
		if c != nil && c.Model != m.Model {
			fmt.Fprintf(stderr, "quoter headroom: calibration is for model %q, not %q: not used for it\n", c.Model, m.Model)
			c = nil
		}
		h, a := quoter.ComputeHeadroom(m, c, o)
		out = append(out, headroomReport{Model: m.Model, TokensPerSec: h.TokensPerSec, Concurrency: h.Concurrency, Calibration: c != nil, Assessment: a})
	}
	if len(out) == 0 {
		fmt.Fprintf(stderr, "quoter headroom: model %q is not in the snapshot\n", *model)
		return exitFail
	}
	return printJSON(stdout, stderr, "quoter headroom", out)
}
