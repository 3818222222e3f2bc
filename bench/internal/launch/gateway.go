package launch

import (
	"context"
	"fmt"
	"net/http"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/extproc/testgw"
)

// Gateway is the test gateway (extproc/testgw) in front of an EPP, playing
// Envoy: client -> gateway -> ext_proc -> replica.
type Gateway struct {
	gw     *testgw.Gateway
	cancel context.CancelFunc
	done   chan error
}

// StartGateway serves the gateway until Close.
func StartGateway(cfg testgw.Config, log *zap.Logger) (*Gateway, error) {
	gw, err := testgw.New(cfg, log.Named("gateway"))
	if err != nil {
		return nil, fmt.Errorf("cannot start the test gateway: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &Gateway{gw: gw, cancel: cancel, done: make(chan error, 1)}
	go func() { g.done <- gw.Run(ctx) }()
	return g, nil
}

// URL is the gateway's base URL (http://127.0.0.1:port).
func (g *Gateway) URL() string { return "http://" + g.gw.Addr() }

// OpenStreams is how many ext_proc streams are open on each EPP host, by
// its gRPC address (testgw.Gateway.OpenStreams).
func (g *Gateway) OpenStreams() map[string]int { return g.gw.OpenStreams() }

// ServeHTTP runs one request through the gateway without a socket in
// between, for a load generator in the same process.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) { g.gw.ServeHTTP(w, r) }

// Close stops the gateway and waits for it; closing it again does nothing.
func (g *Gateway) Close() error {
	if g.cancel == nil {
		return nil
	}
	g.cancel()
	g.cancel = nil
	if err := <-g.done; err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	return nil
}
