package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/omnious/provider-node/bench/load"
	"github.com/omnious/provider-node/internal/cli"
)

// runFloor is `bench floor`: the no-op ext_proc server `bench load -floor`
// runs in the EPP's place, on a loopback address, until SIGTERM. It is
// internal, the child process launch.StartFloor starts, not a user command:
// usage leaves it out (floorCommand).
func runFloor(args []string) error {
	fs := flag.NewFlagSet("bench floor", flag.ContinueOnError)
	addr := fs.String("grpc-addr", "127.0.0.1:9002", "loopback address to serve ext_proc on")
	dests := fs.String("dest", "", "comma-separated ip:port endpoints to route to in turn (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cli.NonNegative(fs); err != nil {
		return fmt.Errorf("%s: %w", fs.Name(), err)
	}
	if fs.NArg() > 0 {
		return errors.New("bench floor: want -dest and no arguments")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return load.ServeFloor(ctx, *addr, splitList(*dests))
}
