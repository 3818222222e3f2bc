package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/omnious/provider-node/bench/chaos"
	"github.com/omnious/provider-node/internal/cli"
)

// errChaosFailed makes the command exit non-zero after printing the table.
var errChaosFailed = errors.New("chaos: at least one scenario failed")

// runChaos is `bench chaos` (bench/chaos): scripted faults against
// enginesim processes, the EPP and the test gateway on 127.0.0.1, and a
// table of expected and observed outcomes with recovery times.
func runChaos(args []string) error {
	fs := flag.NewFlagSet("bench chaos", flag.ContinueOnError)
	enginesim := fs.String("enginesim", "bin/enginesim", "enginesim binary")
	scenarios := fs.String("scenarios", "", "comma-separated scenarios (default all: "+strings.Join(chaos.Scenarios(), ",")+")")
	logLevel := fs.String("log-level", "error", "debug, info, warn or error")
	adminToken := fs.Bool("admin-token", false, "the EPPs' admin ports ask for a bearer token, which siblings, the quoter and the suite present")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cli.NonNegative(fs); err != nil {
		return fmt.Errorf("%s: %w", fs.Name(), err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	ctx, log, done, err := session(*logLevel)
	if err != nil {
		return err
	}
	defer done()
	start := time.Now()
	results, err := chaos.Run(ctx, chaos.Options{EnginesimBin: *enginesim, Scenarios: splitList(*scenarios),
		Log: log, Progress: os.Stderr, AdminToken: *adminToken})
	if len(results) > 0 {
		fmt.Println()
		if werr := chaos.WriteTable(os.Stdout, results); werr != nil {
			return werr
		}
		fmt.Printf("\n%d scenarios in %s\n", len(results), time.Since(start).Round(time.Second))
	}
	if err != nil {
		return err
	}
	if !chaos.Passed(results) {
		return errChaosFailed
	}
	return nil
}
