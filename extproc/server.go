// Package extproc is the Envoy ext_proc v3 server of the EndpointPicker: it
// follows a request through Envoy's external-processing stream, parses its
// OpenAI body once, asks the scheduler where it goes, tells Envoy through
// x-gateway-destination-endpoint and envoy.lb metadata, and watches the
// response (status, usage, served endpoint) to report back to the
// scheduler. The protocol is the Gateway API Inference Extension's
// EndpointPicker contract; errors reach clients as OpenAI-style JSON.
package extproc

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/omnious/provider-node/internal/adminauth"
	"github.com/omnious/provider-node/internal/label"
	"github.com/omnious/provider-node/rules"
	"github.com/omnious/provider-node/scheduler"
)

// Picker admits requests and chooses their endpoints; the scheduler
// implements it. Admit may wait (flow control, bounded by ctx); Pick never
// does, and releases the ticket Admit returned. Neither keeps r.Tokens,
// r.Prefix or r.PromptText once Pick returned: the server reuses their
// memory, and Prefix's is the prompter's cache's.
type Picker interface {
	Admit(ctx context.Context, r *scheduler.Request) (*scheduler.Ticket, error)
	Pick(r *scheduler.Request, t *scheduler.Ticket) (*scheduler.Decision, error)
}

// Header and metadata names of the EndpointPicker protocol.
const (
	HeaderDestination  = "x-gateway-destination-endpoint"
	HeaderModelRewrite = "x-gateway-model-name-rewrite"
	// HeaderReason carries the machine-readable cause of an EPP rejection
	// (the scheduler.Error reason, or bad_request, body_too_large, ...).
	HeaderReason   = "x-omnious-epp-reason"
	MetadataLB     = "envoy.lb"
	MetadataSubset = "envoy.lb.subset_hint"
	KeySubset      = "x-gateway-destination-endpoint-subset"
	KeyServed      = "x-gateway-destination-endpoint-served"
	// AttributesExtProc and AttrUpstreamAddress: Envoy's ext_proc filter
	// sends the attributes its response_attributes lists under its own
	// name; upstream.address is the ip:port the router connected to, the
	// served endpoint where no load balancer writes KeyServed (ORIGINAL_DST).
	AttributesExtProc   = "envoy.filters.http.ext_proc"
	AttrUpstreamAddress = "upstream.address"
	// HeaderCalibration marks `quoter calibrate`'s requests ("1"): their
	// tokens count under scheduler.CalibrationTenant, never as a
	// customer's. It changes nothing else about a request (no band, no
	// routing), so a client that sends it gains nothing.
	HeaderCalibration = "x-omnious-calibration"
	// HeaderCalibrationToken carries the calibration secret
	// (Config.CalibrationTokenFile); it never reaches the engine.
	HeaderCalibrationToken = "x-omnious-calibration-token"
	// MetadataGateway is the ext_proc metadata namespace the gateway
	// writes the band, tenant and session into, keyed by their header
	// names (Config.GatewayHeaders).
	MetadataGateway   = "omnious.gateway"
	headerRequestID   = "x-request-id"
	headerContentLen  = "content-length"
	headerContentType = "content-type"
)

// Server is the ext_proc server. It is safe for concurrent streams.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	cfg         Config
	picker      Picker
	prompter    Prompter
	m           *metrics
	log         *zap.Logger
	injectUsage bool
	idPrefix    string
	ids         atomic.Uint64
	bufs        bodyPool
	// appender is prompter when it can append to a buffer: the prompt's
	// tokens then go into one from tokenBufs (of *[]uint32), back there
	// once Pick returned (TestAllocsPromptTokens).
	appender  promptAppender
	tokenBufs sync.Pool
	// approxModels holds the models already reported as routed without
	// exact tokens, so that is logged once per model, not per request. The
	// model name comes from clients, so at most maxApproxModels are kept.
	approxModels *label.Set   // models already warned about
	models       *label.Set   // target models on metric labels
	aliases      *label.Set   // the client's model names a rewrite replaced
	tracer       trace.Tracer // nil: no tracing
	rules        *rules.Store // nil: no model rules (SetRules)
	prober       Prober       // nil: fallbacks are never taken
	rewriteNames *label.Set   // rewrite names on metric labels
	// engines are the engine families of each model's endpoints
	// (SetModelEngines); nil until told.
	engines atomic.Pointer[map[string]Engines]

	// calToken is the calibration secret; nil: none (SetCalibrationToken).
	calToken *adminauth.Token

	// series holds each (client, target) label pair's metric children,
	// copied on write under seriesMu; streamEnds and promptModes the
	// children of the other counters' few label values.
	series      atomic.Pointer[map[[2]string]*series]
	seriesMu    sync.Mutex
	streamEnds  map[string]prometheus.Counter
	promptModes map[string]prometheus.Counter
	// streams hands a new stream to an idle receive loop (see receiver).
	streams chan *watch
	watches sync.Pool // of *watch, for streams to come
}

// Bounds of the client-controlled names the server keeps: model names
// reach metric labels and a warning set. Past them, later names share one
// label value and get no warning of their own.
const (
	maxApproxModels = 256
	maxModelLabels  = 256
	maxAliasLabels  = 64
	unknownLabel    = "unknown"
)

// firstApprox reports whether model is seen in approximate mode for the
// first time (false once the bounded set is full).
func (s *Server) firstApprox(model string) bool {
	_, added := s.approxModels.Add(model)
	return added
}

// SetCalibrationToken sets the secret that marks calibration requests
// (Config.CalibrationTokenFile, read by the caller); call it before
// serving.
func (s *Server) SetCalibrationToken(tok []byte) {
	t := adminauth.NewToken(tok)
	s.calToken = &t
}

// NewServer builds a server; cfg gets its defaults applied. prompter may be
// nil (every request is routed in approximate mode); reg may be nil (no
// metrics exported). A metric that cannot be registered is logged.
func NewServer(cfg Config, picker Picker, prompter Prompter, reg prometheus.Registerer, log *zap.Logger) *Server {
	cfg = cfg.WithDefaults()
	m, err := newMetrics(reg)
	if err != nil {
		log.Error("cannot register ext_proc metrics", zap.Error(err))
	}
	appender, _ := prompter.(promptAppender)
	return &Server{
		cfg: cfg, picker: picker, prompter: prompter, appender: appender, m: m, log: log,
		injectUsage:  *cfg.InjectUsage,
		idPrefix:     "epp-" + strconv.FormatInt(time.Now().UnixNano()&0xffffffffff, 36) + "-",
		approxModels: label.NewSet(maxApproxModels, ""),
		models:       label.NewSet(maxModelLabels, unknownLabel),
		aliases:      label.NewSet(maxAliasLabels, unknownLabel),
		streamEnds:   children(m.streams, streamEndValues),
		promptModes:  children(m.promptMode, promptModeValues),
		streams:      make(chan *watch),
	}
}

// Register adds the ext_proc service to g.
func (s *Server) Register(g *grpc.Server) { extprocv3.RegisterExternalProcessorServer(g, s) }

// Process implements the ext_proc stream: one HTTP request and its response.
// A stream whose peer goes quiet ends after the idle timeout of its phase
// (Config).
func (s *Server) Process(srv grpc.BidiStreamingServer[extprocv3.ProcessingRequest, extprocv3.ProcessingResponse]) error {
	w := s.watch(srv)
	st := &w.st
	if s.cfg.RequestIdleTimeout < 0 && s.cfg.ResponseIdleTimeout < 0 {
		for {
			req, err := srv.Recv()
			if done, err := st.step(req, err); done {
				s.recycle(w)
				return err
			}
		}
	}
	// Messages are received and handled by a receive loop (see receiver),
	// without a hand-off per message; this goroutine waits for the loop's
	// end, or for an idle timer's, which ends a stream that has been quiet
	// too long. Recv cannot be interrupted, but returning ends the RPC, and
	// then Recv fails.
	w.last.Store(time.Now().UnixNano())
	w.mu.Lock()
	if w.timer == nil {
		w.timer = time.AfterFunc(armFor(st.idleTimeout()), w.fire)
	} else {
		w.timer.Reset(armFor(st.idleTimeout()))
	}
	w.mu.Unlock()
	select {
	case s.streams <- w: // an idle receive loop takes it
	default:
		go s.receiver(w)
	}
	err := <-w.done
	if w.timer.Stop() {
		// The receive loop ended the stream and has let go of w, and the
		// timer will not call fire: nothing touches w any more.
		s.recycle(w)
	}
	// Else the timer ended the stream, or its fire is running: either may
	// still read w, which is left to the collector.
	return err
}

// defaultMode is the body mode a stream assumes until Envoy announces one.
func (s *Server) defaultMode() filterv3.ProcessingMode_BodySendMode {
	if s.cfg.DefaultBodyMode == ModeBuffered {
		return filterv3.ProcessingMode_BUFFERED
	}
	return filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
}
