package testgw

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

// echoStream adds to the routing reply a mutation setting every request
// header back, pseudo-headers included (as llm-d-router's EPP does), plus
// an Envoy-internal header and an invalid value, and removes :path and host.
type echoStream struct {
	extprocv3.ExternalProcessor_ProcessServer
	mu   sync.Mutex
	seen []*corev3.HeaderValue
}

func (s *echoStream) Recv() (*extprocv3.ProcessingRequest, error) {
	req, err := s.ExternalProcessor_ProcessServer.Recv()
	if h := req.GetRequestHeaders(); h != nil {
		s.mu.Lock()
		s.seen = h.GetHeaders().GetHeaders()
		s.mu.Unlock()
	}
	return req, err
}

func (s *echoStream) Send(resp *extprocv3.ProcessingResponse) error {
	if hr := resp.GetRequestHeaders(); hr != nil {
		m := hr.GetResponse().GetHeaderMutation()
		s.mu.Lock()
		for _, h := range s.seen {
			m.SetHeaders = append(m.SetHeaders, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: h.Key, RawValue: append([]byte(nil), h.RawValue...)}})
		}
		s.mu.Unlock()
		m.SetHeaders = append(m.SetHeaders,
			&corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: ":authority", RawValue: []byte("elsewhere:1")}},
			&corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "x-envoy-original-path", RawValue: []byte("/x")}},
			&corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "x-bad", RawValue: []byte("a\nb")}},
			&corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "x-added", RawValue: []byte("yes")}})
		m.RemoveHeaders = append(m.RemoveHeaders, ":path", "host")
	}
	return s.ExternalProcessor_ProcessServer.Send(resp)
}

type echoEPP struct{ *Floor }

func (e echoEPP) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	return e.Floor.Process(&echoStream{ExternalProcessor_ProcessServer: st})
}

// TestHeaderMutationRules: an EPP that echoes the request's headers in its
// routing reply (pseudo-headers, host, content-length) and tries Envoy's
// own headers and an invalid value does not fail the request: as Envoy
// under its default mutation rules, the gateway ignores what it may not
// change and applies the rest.
func TestHeaderMutationRules(t *testing.T) {
	var got http.Header
	var gotHost string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got, gotHost = r.Header.Clone(), r.Host
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	defer upstream.Close()
	dest := strings.TrimPrefix(upstream.URL, "http://")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(srv, echoEPP{&Floor{Dests: []string{dest}}})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	gw := runGateway(t, Config{EPP: lis.Addr().String(), HealthInterval: -1})

	before := RejectedMutations()
	resp, body := post(t, gw, "/v1/chat/completions", `{"model":"m"}`, "X-Client", "c1")
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.Equal(t, "yes", got.Get("X-Added"), "allowed mutations apply")
	require.Equal(t, "c1", got.Get("X-Client"), "an echoed header is unchanged")
	require.Empty(t, got.Get("X-Envoy-Original-Path"), "x-envoy-* is Envoy's")
	require.Empty(t, got.Get("X-Bad"), "an invalid value is dropped")
	require.Equal(t, dest, gotHost, "host and :authority are not the processor's to change")
	// :authority, x-envoy-*, the invalid value, and the removal of :path
	// and host, besides the echoed :method, :authority, :scheme and host.
	require.GreaterOrEqual(t, RejectedMutations()-before, int64(5))
}
