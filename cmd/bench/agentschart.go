package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/omnious/provider-node/bench/compare"
)

// maxContractBytes bounds one -json contract bench agents-chart reads.
const maxContractBytes = 16 << 20

// runAgentsChart is bench agents-chart: goodput and hit rate against the
// offered agents, across agents runs' JSON contracts.
func runAgentsChart(args []string) error {
	fs := flag.NewFlagSet("bench agents-chart", flag.ContinueOnError)
	out := fs.String("html", "out/agents-chart.html", "the page to write")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: bench agents-chart [-html FILE] RUN.json[@AGENTS]...\n\tgoodput and hit rate per policy against the closed-loop agents of bench -scenario agents runs (their -json);\n\t@AGENTS gives the agents of a contract written before it carried them")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("agents-chart: give the runs' JSON files")
	}
	var runs []compare.AgentsRun
	for _, arg := range fs.Args() {
		path, agents := arg, 0
		if i := strings.LastIndexByte(arg, '@'); i > 0 {
			n, err := strconv.Atoi(arg[i+1:])
			if err != nil || n < 1 {
				return fmt.Errorf("agents-chart: %q: want RUN.json@AGENTS with AGENTS a positive count", arg)
			}
			path, agents = arg[:i], n
		}
		b, err := readBounded(path, maxContractBytes)
		if err != nil {
			return err
		}
		var c compare.ContractJSON
		if err := json.Unmarshal(b, &c); err != nil {
			return fmt.Errorf("agents-chart: %s: %w", path, err)
		}
		if agents > 0 {
			c.Agents = agents
		}
		runs = append(runs, compare.AgentsRun{Name: strings.TrimSuffix(filepath.Base(path), ".json"), Contract: c})
	}
	f, err := os.Create(*out)
	if err != nil {
		return fmt.Errorf("agents-chart: %w", err)
	}
	if err := compare.WriteAgentsChart(f, runs); err != nil {
		f.Close()
		return fmt.Errorf("agents-chart: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("agents-chart: %w", err)
	}
	fmt.Println("report:", *out)
	return nil
}

// readBounded reads path, refusing a file over max bytes.
func readBounded(path string, max int64) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("agents-chart: %w", err)
	}
	if st.Size() > max {
		return nil, fmt.Errorf("agents-chart: %s is %d bytes, over %d", path, st.Size(), max)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("agents-chart: %w", err)
	}
	return b, nil
}
