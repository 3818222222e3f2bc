package extproc

import (
	"io"
	"strconv"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/endpoint"
)

// BenchmarkReceiveLoop is what Server.receiver saves: one 1 KB request's
// handling (headers, body, routing reply, stream end; no gRPC) on a
// goroutine started for it, whose small stack grows while it routes, and
// on a long-lived receive loop whose stack has grown already. The
// difference is a goroutine's start and its stack's growth.
func BenchmarkReceiveLoop(b *testing.B) {
	body := chatRequest(1 << 10)
	s := NewServer(Config{}, onePicker{[]*endpoint.Endpoint{{Addr: "127.0.0.1:8000"}}}, nil, nil, zap.NewNop())
	msgs := []*extprocv3.ProcessingRequest{
		reqHeaders(false, ":method", "POST", ":path", "/v1/chat/completions", "content-length", strconv.Itoa(len(body))),
		reqBody(string(body), true),
	}
	send := func(*extprocv3.ProcessingResponse) error { return nil }
	srv := &ctxStream{}
	request := func() {
		w := s.watch(srv)
		w.st.send = send
		for _, m := range msgs {
			if done, err := w.st.step(m, nil); done {
				panic(err)
			}
		}
		w.st.step(nil, io.EOF)
		s.recycle(w)
	}
	done := make(chan struct{})
	b.Run("fresh goroutine", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			go func() {
				request()
				done <- struct{}{}
			}()
			<-done
		}
	})
	b.Run("receive loop", func(b *testing.B) {
		work := make(chan struct{})
		defer close(work)
		go func() {
			for range work {
				request()
				done <- struct{}{}
			}
		}()
		b.ReportAllocs()
		for b.Loop() {
			work <- struct{}{}
			<-done
		}
	})
}
