package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/omnious/provider-node/bench/compare"
)

// runCapacity is `bench capacity`: does a quote promise what the fleet
// serves within its objectives?
func runCapacity(args []string) error {
	fs := flag.NewFlagSet("bench capacity", flag.ContinueOnError)
	var o compare.CapacityOptions
	scenario := fs.String("scenario", compare.PresetDemo, "fleet and traffic: a preset ("+compare.PresetDemo+")")
	replicas := fs.Int("replicas", 0, "replicas (0: the scenario's)")
	fs.DurationVar(&o.Objectives.TTFT, "slo-ttft-p95", 2*time.Second, "objective for p95 time to first token (model time)")
	fs.DurationVar(&o.Objectives.ITL, "slo-itl-p95", 50*time.Millisecond, "objective for p95 inter-token latency (model time)")
	fs.DurationVar(&o.StageDuration, "stage", 40*time.Second, "length of each measured step, model time")
	fs.Float64Var(&o.StartQPS, "start-qps", 2, "first rate of the ladder (model time); it doubles until an objective breaks")
	fs.IntVar(&o.Refine, "refine", 3, "bisection steps at the edge")
	fs.BoolVar(&o.SkipCalibration, "skip-calibration", false, "do not run quoter calibrate first")
	jsonOut := fs.String("json", "", "write the report as JSON to this file")
	logLevel := fs.String("log-level", "warn", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench capacity: unexpected arguments %v", fs.Args())
	}
	base, err := compare.Preset(*scenario)
	if err != nil {
		return err
	}
	if *replicas > 0 {
		base.Fleet.Replicas = *replicas
	}
	o.Base = base
	ctx, log, done, err := session(*logLevel)
	if err != nil {
		return err
	}
	defer done()
	o.Base.Log = log
	rep, err := compare.RunCapacity(ctx, o)
	if err != nil {
		return err
	}
	if *jsonOut != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("cannot write %s: %w", *jsonOut, err)
		}
	}
	return rep.WriteTable(os.Stdout)
}
