package load

import (
	"context"
	"errors"
	"fmt"
	"net"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/omnious/provider-node/extproc"
	"github.com/omnious/provider-node/extproc/testgw"
)

// ServeFloor serves the no-op ext_proc server (testgw.Floor) on the
// loopback address addr, with the EPP's gRPC server options, routing to
// dests in turn, until ctx ends. Options.Floor runs it as `bench floor` in
// the EPP's place, a process of its own as the EPP is.
func ServeFloor(ctx context.Context, addr string, dests []string) error {
	f := &testgw.Floor{Dests: dests}
	if len(f.Dests) == 0 {
		return errors.New("bench floor: want -dest and no arguments")
	}
	host, _, err := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("bench floor: -grpc-addr %q is not a loopback address", addr)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("bench floor: %w", err)
	}
	srv := grpc.NewServer(extproc.Config{}.WithDefaults().ServerOptions()...)
	extprocv3.RegisterExternalProcessorServer(srv, f)
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("bench floor: %w", err)
	}
	return nil
}
