package rig

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnious/provider-node/bench/internal/loopback"
	"github.com/omnious/provider-node/endpoint"
)

// DirectLauncher is a stand-in for the EPP, for tests and for checking a
// fleet: a plain reverse proxy that picks replicas round-robin (policy
// "round-robin") or at random (policy "random", seeded). It is no EPP: no
// ext_proc, no scoring; every other policy is refused.
func DirectLauncher(seed int64) Launcher {
	return func(ctx context.Context, policy string, fleet []endpoint.Endpoint, _ int) (Target, error) {
		if len(fleet) == 0 {
			return nil, errors.New("direct: empty fleet")
		}
		var pick func() string
		switch policy {
		case "round-robin":
			var n atomic.Uint64
			pick = func() string { return fleet[(n.Add(1)-1)%uint64(len(fleet))].Addr }
		case "random":
			var mu sync.Mutex
			rng := rand.New(rand.NewPCG(uint64(seed), 0x646972656374))
			pick = func() string {
				mu.Lock()
				defer mu.Unlock()
				return fleet[rng.IntN(len(fleet))].Addr
			}
		default:
			return nil, fmt.Errorf("direct launcher has only round-robin and random, not %q (the EPP launcher is not wired)", policy)
		}
		return newDirectTarget(pick, loopback.Transport())
	}
}

type directTarget struct {
	srv       *http.Server
	ln        net.Listener
	transport *http.Transport
	done      chan struct{}
	mu        sync.Mutex
	decisions []time.Duration
}

// newDirectTarget serves a proxy to the replicas pick chooses, through
// transport.
func newDirectTarget(pick func() string, transport *http.Transport) (*directTarget, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("direct: cannot listen: %w", err)
	}
	t := &directTarget{ln: ln, transport: transport, done: make(chan struct{})}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			start := time.Now()
			addr := pick()
			t.mu.Lock()
			t.decisions = append(t.decisions, time.Since(start))
			t.mu.Unlock()
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", addr
			pr.Out.Host = addr
		},
		Transport:     t.transport,
		FlushInterval: -1, // stream every chunk at once, as the gateway does
		// The client sees and counts every failure; the proxy's own log
		// would only repeat them on stderr.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	t.srv = &http.Server{Handler: fullDuplex(proxy), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(t.done)
		_ = t.srv.Serve(ln)
	}()
	return t, nil
}

// fullDuplex lets h read the request body after it has started the
// response. The proxy's transport copies a body of known length upstream,
// then reads it once more to check that it ended; on a busy machine that
// read can come after the replica's answer has reached the client. By
// default the HTTP/1 server drains and closes the request body when the
// response starts, so that read fails ("invalid Read on closed Body"), the
// transport tears down the upstream connection and the proxy cuts the
// client's stream mid-answer (unexpected EOF).
//
// The body is closed before the handler returns, so that a body left
// unread (a replica that could not be reached) is drained while it runs:
// drained by the server after it, the server's read of the next request
// would race the background read the drain starts (golang/go#68560).
func fullDuplex(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The server's HTTP/1 writer supports it (HTTP/2 always is).
		_ = http.NewResponseController(w).EnableFullDuplex()
		defer r.Body.Close()
		h.ServeHTTP(w, r)
	})
}

func (t *directTarget) URL() string { return "http://" + t.ln.Addr().String() }

func (t *directTarget) DecisionLatencies() []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]time.Duration(nil), t.decisions...)
}

func (t *directTarget) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := t.srv.Shutdown(ctx)
	<-t.done
	t.transport.CloseIdleConnections()
	if err != nil {
		return fmt.Errorf("direct: cannot shut down: %w", err)
	}
	return nil
}
