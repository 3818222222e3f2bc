package rig

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/bench/internal/loopback"
	"github.com/omnious/provider-node/endpoint"
)

// streamUpstream is a replica stand-in that, like the simulator, reads the
// whole request body, then streams: one event at once, the rest once
// release is closed (nil: at once).
func streamUpstream(t *testing.T, release <-chan struct{}) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: read %d bytes\n\n", len(body))
		w.(http.Flusher).Flush()
		if release != nil {
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return ln.Addr().String()
}

// lateCheckConn holds the proxy's transport right after it has written a
// request body's last bytes (they end with tail), until hold is closed:
// the transport's goroutine descheduled at that point, as on a loaded
// machine. The replica has the whole request by then and answers.
type lateCheckConn struct {
	net.Conn
	tail []byte
	hold <-chan struct{}
	held func()
}

func (c *lateCheckConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err == nil && bytes.HasSuffix(p, c.tail) {
		select {
		case <-c.hold:
		case <-time.After(5 * time.Second):
		}
		c.held()
	}
	return n, err
}

// postStream posts body through the target and reads the SSE answer.
func postStream(ctx context.Context, client *http.Client, url string, body []byte, first func()) (lines []string, reused bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, false, err
	}
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(ci httptrace.GotConnInfo) { reused = ci.Reused }}))
	resp, err := client.Do(req)
	if err != nil {
		return nil, reused, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil, reused, fmt.Errorf("status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if sc.Text() == "" {
			continue
		}
		lines = append(lines, sc.Text())
		if len(lines) == 1 && first != nil {
			first()
		}
	}
	return lines, reused, sc.Err()
}

// TestDirectTargetLateBodyCheck: after copying a request body of known
// length upstream, http.Transport reads the inbound body once more to check
// that it ended. If the replica's answer has reached the client first, the
// proxy's HTTP/1 server must not have closed that body under the transport:
// the failed read would tear down the upstream connection and cut the
// stream the client is reading ("stream broken: unexpected EOF").
func TestDirectTargetLateBodyCheck(t *testing.T) {
	release := make(chan struct{})
	addr := streamUpstream(t, release)
	body := []byte(`{"model": "m", "stream": true, "prompt": "` + strings.Repeat("hello ", 300) + `", "end": "late-check"}`)

	firstSeen, heldDone := make(chan struct{}), make(chan struct{})
	var once, heldOnce sync.Once
	tr := loopback.Transport()
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, a string) (net.Conn, error) {
		c, err := dial(ctx, network, a)
		if err != nil {
			return nil, err
		}
		return &lateCheckConn{Conn: c, tail: body[len(body)-16:], hold: firstSeen,
			held: func() { heldOnce.Do(func() { close(heldDone) }) }}, nil
	}
	target, err := newDirectTarget(func() string { return addr }, tr)
	require.NoError(t, err)
	defer func() { require.NoError(t, target.Close()) }()

	go func() {
		// The transport has gone on from its write; give it ample time to
		// finish the request (or, with the bug, to tear down the
		// connection), then let the replica end the stream.
		select {
		case <-heldDone:
			time.Sleep(200 * time.Millisecond)
		case <-time.After(10 * time.Second):
		}
		close(release)
	}()
	client := &http.Client{Transport: loopback.Transport()}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lines, _, err := postStream(ctx, client, target.URL()+"/v1/completions", body, func() { once.Do(func() { close(firstSeen) }) })
	require.NoError(t, err, "the stream was cut after %q", lines)
	require.Equal(t, []string{fmt.Sprintf("data: read %d bytes", len(body)), "data: [DONE]"}, lines)
}

// TestDirectTargetDeadReplica: a request to a replica that is gone is
// answered 502 without its body ever being read; the client's connection
// stays usable for the next request.
func TestDirectTargetDeadReplica(t *testing.T) {
	live := streamUpstream(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	require.NoError(t, ln.Close())
	target, err := DirectLauncher(1)(context.Background(), "round-robin", []endpoint.Endpoint{{Addr: dead}, {Addr: live}}, 1)
	require.NoError(t, err)
	defer func() { require.NoError(t, target.Close()) }()

	client := &http.Client{Transport: loopback.Transport()}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	body := []byte(`{"prompt": "` + strings.Repeat("x", 5000) + `"}`)
	_, _, err = postStream(ctx, client, target.URL()+"/v1/completions", body, nil)
	require.EqualError(t, err, "status 502")
	time.Sleep(50 * time.Millisecond) // the proxy's server waits for the next request
	lines, reused, err := postStream(ctx, client, target.URL()+"/v1/completions", body, nil)
	require.NoError(t, err)
	require.True(t, reused, "the proxy closed the client's connection after the 502")
	require.Equal(t, []string{fmt.Sprintf("data: read %d bytes", len(body)), "data: [DONE]"}, lines)
}
