// Command bench runs the project's benchmarks: the routing-policy
// comparison by default, the other harnesses as subcommands (bench -h
// lists them all; bench SUBCOMMAND -h a subcommand's flags):
//
//	bench [flags]            compare routing policies, each on a fresh fleet (bench/compare)
//	bench sweep [flags]      sweep EPP config keys and report the Pareto front (bench/compare)
//	bench chaos [flags]      the fault-injection suite (bench/chaos)
//	bench load [flags]       the EPP alone: decisions/s, added latency, memory soak (bench/load)
//	bench capacity [flags]   the capacity proof: quotes against the fleet's true SLO capacity (bench/proof)
//	bench windows [flags]    what the engines did at each load, from bench capacity -record-windows (bench/proof)
//	bench agents-chart RUN.json...   goodput and hit rate against offered agents across agents runs (bench/compare)
//
// The comparison replays a workload through routing policies, each on a
// fresh fleet of (simulated or real) engine replicas, and prints a table on
// stdout, the JSON contract (-json) and an HTML report with charts (-html):
//
//	bench -scenario demo                                  the make demo scenario
//	bench -scenario llmd-73 -check precise -check-throughput
//	bench -trace ../shared/traces/mooncake_synthetic_trace.jsonl -replicas 8 \
//	      -time-scale 8 -fleet process -json out.json -check precise
//	bench -workload chat -sessions 40 -turns 5 -tools
//	bench -urls http://127.0.0.1:8000,http://127.0.0.1:8001 -policies precise,random
//	bench -policies precise -policies 'exec:peer=./epp --config-file {file:peer.yaml} --grpc-port {grpc_port}'
//	                                                      another EPP, same gateway, fleet and workload
//	bench -urls http://127.0.0.1:8000 -policies 'addr:127.0.0.1:9002'   an EPP already running
//	bench sweep -grid grid.yaml [flags]                   sweep EPP config keys, report the Pareto front
//	bench sweep -base precise -set scoring.weights.prefix=1,3,5 -set prefix.balance_rel=1.25,2
//	bench chaos [-scenarios engine-kill,...]             scripted faults, expected vs observed (make chaos)
//	bench load [-prompt-bytes 32k] [-rates 500,1000,2000] [-soak 10m]   EPP decisions/s and added latency; memory soak
//	bench load -floor                                    the same ladder against a no-op ext_proc server (a child process bench load starts)
//
// Latencies of simulated fleets are in model time (wall time x time scale).
// -direct replaces the EPP by a plain round-robin/random reverse proxy.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/internal/cli"
)

func main() {
	if err := run(os.Args[1:]); cli.Failed(err) {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// subcommand is one of bench's user commands besides the comparison.
type subcommand struct {
	name, doc string
	run       func(args []string) error
}

// subcommands are every user subcommand, in the order usage lists them
// (TestUsage).
func subcommands() []subcommand {
	return []subcommand{
		{"sweep", "sweep EPP config keys and report the Pareto front", func(args []string) error { return runCompare(args, true) }},
		{"chaos", "the fault-injection suite: scripted faults, expected vs observed", runChaos},
		{"load", "the EPP alone: decisions/s, added latency, memory soak", runLoad},
		{"capacity", "the capacity proof: quotes against the fleet's true SLO capacity", runCapacity},
		{"windows", "what the engines did at each load, from bench capacity -record-windows", runWindows},
		{"agents-chart", "goodput and hit rate against offered agents, across bench -scenario agents runs' -json", runAgentsChart},
	}
}

// floorCommand is the no-op ext_proc server `bench load -floor` starts as
// a child process in the EPP's place (launch.StartFloor): internal, so
// usage does not list it, but it must keep its name and flags
// (TestFloorIsInternal).
const floorCommand = "floor"

// run hands args to the subcommand they name, the comparison by default.
func run(args []string) error {
	if len(args) > 0 {
		if args[0] == floorCommand {
			return runFloor(args[1:])
		}
		for _, c := range subcommands() {
			if args[0] == c.name {
				return c.run(args[1:])
			}
		}
	}
	return runCompare(args, false)
}

// usage lists every user subcommand; `bench -h` prints it before the
// comparison's flags.
func usage(w io.Writer) {
	fmt.Fprintln(w, "Usage:")
	fmt.Fprintf(w, "  bench [flags]\n\tcompare routing policies, each on a fresh fleet (the flags below)\n")
	for _, c := range subcommands() {
		fmt.Fprintf(w, "  bench %s [flags]\n\t%s\n", c.name, c.doc)
	}
	fmt.Fprintln(w, "bench SUBCOMMAND -h lists a subcommand's flags.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Flags of the comparison:")
}

// session is what every harness run needs: a logger at the -log-level and
// a context that ends on SIGINT or SIGTERM. done flushes and releases both.
func session(level string) (ctx context.Context, log *zap.Logger, done func(), err error) {
	log, err = cli.NewLogger(level)
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	return ctx, log, func() { stop(); _ = log.Sync() }, nil
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
