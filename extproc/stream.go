package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/omnious/provider-node/scheduler"
)

type phase uint8

const (
	phaseRequest  phase = iota // gathering the request
	phaseRouted                // request forwarded, waiting for the response
	phaseResponse              // response under way
	phaseDone                  // answered or finished: later messages are ignored
)

// stream is the state of one ext_proc stream; only its Process goroutine
// touches it.
type stream struct {
	s        *Server
	ctx      context.Context
	send     func(*extprocv3.ProcessingResponse) error
	reqMode  filterv3.ProcessingMode_BodySendMode
	respMode filterv3.ProcessingMode_BodySendMode
	phase    phase
	arrived  time.Time

	path, method, id, rewriteHdr, band, tenant, session string
	genID                                               bool     // id made here: sent upstream as x-request-id
	gatewaySession                                      bool     // session named by the gateway (Config.GatewayHeaders)
	strip                                               []string // control headers the upstream must not see
	trace                                               traceHeaders
	span                                                trace.Span // nil unless tracing
	subset                                              []string
	contentLength                                       int64 // the request's Content-Length, -1 if none; 0 in BUFFERED mode
	bodyOpen                                            bool  // routed at Content-Length: Envoy's end of stream is still to come
	body                                                []byte
	owned                                               []byte // pooled buffers to return, nil if none
	rb                                                  requestBody
	clientModel, targetModel                            string
	clientLabel, targetLabel                            string  // the models as metric labels, once routed
	series                                              *series // their metric children, once routed
	injected                                            bool
	decision                                            *scheduler.Decision
	req                                                 scheduler.Request

	// The replies are built in place, in the recycled stream state
	// (TestAllocsReplies, TestAllocsStreamState): gRPC's Send has encoded
	// a message when it returns.
	reply routeReply
	chunk chunkReply

	served    string
	status    int
	firstByte time.Duration
	respBytes int
	resp      respState
	end       string // how the stream ended, for the streams counter

	rejected     int // status of the EPP's own error response, 0 if none
	rejectReason string
	fallback     string // HeaderReason of a request sent to a fallback model, "" if none
}

// watch returns a stream's state for srv: a recycled one when there is
// one. A stream's state is a few kilobytes with pointers, to be zeroed and
// scanned; allocating one per stream was 3 KB of the 18.5 KB a 1 KB round
// trip allocated on both sides (BenchmarkExtProcRoundTrip). A stream
// allocates none of it: TestAllocsStreamState.
func (s *Server) watch(srv grpc.BidiStreamingServer[extprocv3.ProcessingRequest, extprocv3.ProcessingResponse]) *watch {
	w, _ := s.watches.Get().(*watch)
	if w == nil {
		w = &watch{done: make(chan error, 1)}
		w.send = func(r *extprocv3.ProcessingResponse) error { return w.srv.Send(r) }
	}
	// Field by field, on w.st zeroed by recycle: a composite literal
	// would be built in a temporary on the stack, several kilobytes the
	// handler goroutine's small stack had to grow for (a fresh
	// goroutine's growth: BenchmarkReceiveLoop).
	w.srv = srv
	st := &w.st
	st.s, st.ctx, st.send = s, srv.Context(), w.send
	st.reqMode, st.respMode = s.defaultMode(), s.defaultMode()
	return w
}

// recycle keeps w for another stream once nothing refers to it; what the
// stream held goes to the collector now, not when w is next used.
func (s *Server) recycle(w *watch) {
	w.srv, w.ended = nil, false
	w.st = stream{} // zeroed in place; see watch
	s.watches.Put(w)
}

// receiverKeep is how long a receive loop waits for another stream before
// its goroutine exits.
const receiverKeep = time.Second

// receiver runs receive loops, one stream after another, on one
// goroutine. A fresh goroutine's stack is small, and receiving, routing
// and sending a request need a larger one: growing it copied the stack on
// every stream, about 6% of a 1 KB exchange against the floor server
// (BenchmarkExtProcVsFloor, median ratio 1.24 -> 1.17);
// BenchmarkReceiveLoop sets the two side by side without gRPC. A
// goroutine that finds no stream for receiverKeep exits.
func (s *Server) receiver(w *watch) {
	var keep *time.Timer
	for {
		w.receive()
		if keep == nil {
			keep = time.NewTimer(receiverKeep)
		} else {
			keep.Reset(receiverKeep)
		}
		select {
		case w = <-s.streams:
		case <-keep.C:
			return
		}
	}
}

// watch is a stream's state and what its receive loop and its idle timer
// share. Server.recycle keeps it, with its timer and channel, for a later
// stream.
type watch struct {
	srv   grpc.BidiStreamingServer[extprocv3.ProcessingRequest, extprocv3.ProcessingResponse]
	st    stream
	send  func(*extprocv3.ProcessingResponse) error // srv.Send, made once
	mu    sync.Mutex                                // held while a message is handled or the stream is ended for idleness
	ended bool                                      // under mu: the stream is over, nothing more is handled
	timer *time.Timer
	last  atomic.Int64 // unix nanos of the last message
	done  chan error   // Process's result: the receive loop's or the idle timer's
}

// armFor is how long the idle timer waits for a phase whose timeout is d
// (<= 0: none; the timer is re-armed when a phase with one begins).
func armFor(d time.Duration) time.Duration {
	if d <= 0 {
		return time.Hour
	}
	return d
}

// receive is a stream's receive loop.
func (w *watch) receive() {
	st := &w.st
	for {
		req, err := w.srv.Recv()
		w.last.Store(time.Now().UnixNano())
		w.mu.Lock()
		if w.ended {
			w.mu.Unlock()
			return
		}
		before := st.idleTimeout()
		done, err := st.step(req, err)
		w.ended = done
		if after := st.idleTimeout(); !done && after > 0 && (before <= 0 || after < before) {
			// The new phase's timeout is shorter than the one the
			// timer was armed for (the defaults only grow).
			w.timer.Reset(after)
		}
		w.mu.Unlock()
		if done {
			w.done <- err
			return
		}
	}
}

// fire ends the stream if it has been quiet for its phase's timeout, else
// re-arms the timer for the rest of it.
func (w *watch) fire() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return
	}
	st := &w.st
	d := st.idleTimeout()
	if d <= 0 {
		w.timer.Reset(armFor(d))
		return
	}
	quiet := time.Duration(time.Now().UnixNano() - w.last.Load())
	if quiet < d {
		w.timer.Reset(d - quiet)
		return
	}
	w.ended = true
	w.done <- st.idle()
}

// step handles one received message or receive error; done says the
// stream is over and Process returns err.
func (st *stream) step(req *extprocv3.ProcessingRequest, err error) (done bool, _ error) {
	if err != nil {
		if err == io.EOF {
			st.close(nil)
			return true, nil
		}
		st.close(err)
		if c := status.Code(err); c == codes.Canceled || c == codes.DeadlineExceeded {
			return true, nil
		}
		return true, err
	}
	if err := st.handle(req); err != nil {
		st.close(err)
		return true, err
	}
	return false, nil
}

func (st *stream) handle(req *extprocv3.ProcessingRequest) error {
	if pc := req.GetProtocolConfig(); pc != nil {
		if pc.RequestBodyMode != filterv3.ProcessingMode_NONE {
			st.reqMode = pc.RequestBodyMode
		}
		st.respMode = pc.ResponseBodyMode
	}
	if md := req.GetMetadataContext(); md != nil {
		if lb := md.FilterMetadata[MetadataLB]; lb != nil {
			if v := lb.Fields[KeyServed]; v != nil && v.GetStringValue() != "" {
				st.served = v.GetStringValue()
			}
		}
	}
	// The address Envoy connected to, when the config asks for it
	// (deploy/envoy: response_attributes); a load balancer's KeyServed,
	// when present, names the same host and wins. e2e/envoy's
	// TestServedEndpointReported keeps Envoy sending it.
	if a := req.GetAttributes()[AttributesExtProc]; a != nil && st.served == "" {
		if v := a.Fields[AttrUpstreamAddress]; v != nil && v.GetStringValue() != "" {
			st.served = v.GetStringValue()
		}
	}
	if st.phase == phaseDone {
		// Finished (or answered): only trailers still need a reply, and
		// only when the request went upstream.
		if st.decision != nil {
			switch req.Request.(type) {
			case *extprocv3.ProcessingRequest_RequestTrailers, *extprocv3.ProcessingRequest_ResponseTrailers:
				return st.sendTrailers(req.Request)
			}
		}
		return nil
	}
	switch r := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.requestHeaders(req, r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.requestBody(r.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return st.requestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return st.responseHeaders(r.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return st.responseBody(r.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return st.responseTrailers()
	}
	return nil
}

// sendTrailers answers a trailers message without changing the trailers.
func (st *stream) sendTrailers(req any) error {
	if _, ok := req.(*extprocv3.ProcessingRequest_RequestTrailers); ok {
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
			RequestTrailers: &extprocv3.TrailersResponse{}}})
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
		ResponseTrailers: &extprocv3.TrailersResponse{}}})
}

// idleTimeout is how long the stream may wait for Envoy's next message in
// its current phase (<= 0: forever).
func (st *stream) idleTimeout() time.Duration {
	if st.phase == phaseRequest {
		return st.s.cfg.RequestIdleTimeout
	}
	return st.s.cfg.ResponseIdleTimeout
}

// idle ends a stream whose peer sent nothing for the phase's idle timeout:
// a request still being gathered is answered 408; a routed one can no
// longer be answered, so the stream ends with DeadlineExceeded and the
// scheduler hears it ended early (a quiet proxy is not a failed replica).
func (st *stream) idle() error {
	d := st.idleTimeout()
	if ce := st.s.log.Check(zap.InfoLevel, "ext_proc stream idle: closing it"); ce != nil {
		ce.Write(zap.String("id", st.id), zap.Bool("request_phase", st.phase == phaseRequest), zap.Duration("idle_timeout", d))
	}
	if st.phase == phaseRequest {
		err := st.reject(408, "request_timeout", fmt.Sprintf("no request data from the client for %s", d))
		st.end = "timeout"
		st.close(nil)
		return err
	}
	err := status.Errorf(codes.DeadlineExceeded, "no message from the proxy for %s after the request was routed", d)
	st.close(err)
	return err
}

// errStreamEnded is reported to the scheduler when Envoy closed the stream
// before the response ended: the client went away, response processing is
// off, Envoy reset the stream or timed it out. Which one the EPP cannot
// tell, so the scheduler takes it as no evidence about the replica unless a
// 5xx status came first.
var errStreamEnded = errors.New("ext_proc stream ended before the response completed")

// close ends the stream: a request still in flight is finished with
// errStreamEnded and whatever status it had seen.
func (st *stream) close(err error) {
	if st.phase != phaseDone {
		switch c := status.Code(err); {
		case err == nil || c == codes.Canceled:
			st.finish(errStreamEnded, "cancelled")
		case c == codes.DeadlineExceeded:
			st.finish(fmt.Errorf("%w: %w", errStreamEnded, err), "timeout")
		default:
			st.finish(fmt.Errorf("%w: %w", errStreamEnded, err), "error")
		}
	}
	if st.end == "" {
		st.end = "cancelled"
	}
	inc(st.s.streamEnds, st.s.m.streams, st.end)
	st.endSpan(err)
}
