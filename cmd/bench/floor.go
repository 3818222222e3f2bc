package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/omnious/provider-node/extproc"
	"github.com/omnious/provider-node/extproc/testgw"
)

// runFloor is `bench floor`: a no-op ext_proc server (testgw.Floor) on a
// loopback address, with the EPP's gRPC server options, until SIGTERM.
// `bench load -floor` runs it in the EPP's place.
func runFloor(args []string) error {
	fs := flag.NewFlagSet("bench floor", flag.ContinueOnError)
	addr := fs.String("grpc-addr", "127.0.0.1:9002", "loopback address to serve ext_proc on")
	dests := fs.String("dest", "", "comma-separated ip:port endpoints to route to in turn (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	f := &testgw.Floor{Dests: splitList(*dests)}
	if len(f.Dests) == 0 || fs.NArg() > 0 {
		return errors.New("bench floor: want -dest and no arguments")
	}
	host, _, err := net.SplitHostPort(*addr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("bench floor: -grpc-addr %q is not a loopback address", *addr)
	}
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("bench floor: %w", err)
	}
	srv := grpc.NewServer(extproc.Config{}.WithDefaults().ServerOptions()...)
	extprocv3.RegisterExternalProcessorServer(srv, f)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("bench floor: %w", err)
	}
	return nil
}
