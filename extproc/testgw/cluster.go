package testgw

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/omnious/provider-node/extproc"
)

// HealthService is the gRPC health service the gateway checks on each EPP
// host's ext_proc port, the name the shipped Envoy config health-checks.
const HealthService = "envoy.service.ext_proc.v3.ExternalProcessor"

// cluster is the ext_proc cluster of several EPP hosts, as Envoy runs it:
// new streams go round-robin over the hosts that pass their health checks;
// a host whose stream cannot be opened is marked down at once and the
// stream tries the next host (nothing was sent yet, so nothing is
// repeated). A stream that failed after its first message is never retried:
// the EPP may have acted on it.
type cluster struct {
	log   *zap.Logger
	hosts []*host
	next  atomic.Uint64
}

type host struct {
	addr   string
	conn   *grpc.ClientConn
	client extprocv3.ExternalProcessorClient
	health healthpb.HealthClient
	down   atomic.Bool
	fails  int // consecutive failed checks; touched by check only
	// open counts the streams opened on this host whose exchange has not
	// ended yet.
	open atomic.Int64
}

// newCluster connects to addrs; a lost connection is tried again after at
// most reconnect, as Envoy connects again for its next health check or
// stream (grpc-go's default backoff grows to 120 s, and a host would stay
// unreachable long after it is back).
func newCluster(addrs []string, reconnect time.Duration, log *zap.Logger) (*cluster, error) {
	c := &cluster{log: log}
	pool := extproc.NewBufferPool()
	for _, addr := range addrs {
		if err := requireLoopback(addr); err != nil {
			c.close()
			return nil, fmt.Errorf("cannot use the EPP: %w", err)
		}
		// The EPP's window and buffer sizes (extproc.Config.ServerOptions)
		// on this side too: with gRPC's 64 KiB default window the client
		// runs BDP estimation, which PINGs the EPP on the data it
		// receives, so nearly every re-emitted body cost both sides an
		// extra frame each way.
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20),
				grpc.ForceCodecV2(extproc.NewCodec(pool))),
			grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: min(100*time.Millisecond, reconnect),
				Multiplier: backoff.DefaultConfig.Multiplier, Jitter: backoff.DefaultConfig.Jitter, MaxDelay: reconnect},
				MinConnectTimeout: time.Second}),
			grpc.WithInitialWindowSize(1<<20), grpc.WithInitialConnWindowSize(16<<20),
			grpc.WithReadBufferSize(128<<10), grpc.WithWriteBufferSize(128<<10))
		if err != nil {
			c.close()
			return nil, fmt.Errorf("cannot connect to the EPP at %s: %w", addr, err)
		}
		c.hosts = append(c.hosts, &host{addr: addr, conn: conn, client: extprocv3.NewExternalProcessorClient(conn),
			health: healthpb.NewHealthClient(conn)})
	}
	return c, nil
}

// open starts a stream on the next healthy host, trying each host once,
// and counts it open on the host it returns (the caller's done ends it).
// With every host down it tries them all, as Envoy's panic threshold does
// rather than fail every request.
func (c *cluster) open(ctx context.Context) (*host, grpc.BidiStreamingClient[extprocv3.ProcessingRequest, extprocv3.ProcessingResponse], error) {
	n := len(c.hosts)
	start := int(c.next.Add(1)-1) % n
	var errs []error
	for pass := range 2 {
		for i := range n {
			h := c.hosts[(start+i)%n]
			if pass == 0 && h.down.Load() {
				continue
			}
			st, err := h.client.Process(ctx)
			if err == nil {
				h.open.Add(1)
				return h, st, nil
			}
			if ctx.Err() != nil {
				return nil, nil, err
			}
			h.down.Store(true)
			errs = append(errs, fmt.Errorf("%s: %w", h.addr, err))
		}
	}
	return nil, nil, errors.Join(errs...)
}

// openStreams is each host's count of open streams, by address.
func (c *cluster) openStreams() map[string]int {
	out := make(map[string]int, len(c.hosts))
	for _, h := range c.hosts {
		out[h.addr] = int(h.open.Load())
	}
	return out
}

// check health-checks every host each interval until ctx ends.
func (c *cluster) check(ctx context.Context, interval time.Duration, unhealthy int) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		var wg sync.WaitGroup
		for _, h := range c.hosts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				h.check(ctx, unhealthy, c.log)
			}()
		}
		wg.Wait()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// healthTimeout bounds one check, as the shipped Envoy config's timeout.
const healthTimeout = time.Second

func (h *host) check(ctx context.Context, unhealthy int, log *zap.Logger) {
	cctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	resp, err := h.health.Check(cctx, &healthpb.HealthCheckRequest{Service: HealthService})
	if ctx.Err() != nil {
		return
	}
	if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
		h.fails = 0
		if h.down.Swap(false) {
			log.Debug("EPP host healthy", zap.String("epp", h.addr))
		}
		return
	}
	h.fails++
	if h.fails >= unhealthy && !h.down.Swap(true) {
		log.Debug("EPP host unhealthy", zap.String("epp", h.addr), zap.Error(err), zap.Stringer("status", resp.GetStatus()))
	}
}

func (c *cluster) close() error {
	var errs []error
	for _, h := range c.hosts {
		errs = append(errs, h.conn.Close())
	}
	return errors.Join(errs...)
}
