// Package testgw is a test gateway that plays Envoy's part for tests, the
// bench and the demo: an HTTP listener that runs each request through the
// EPP's ext_proc stream as Envoy's ext_proc filter does in
// FULL_DUPLEX_STREAMED mode, forwards it to the endpoint the EPP chose
// (walking the fallback list on a connect failure or a 5xx, while nothing
// has reached the client), and streams the response back through the EPP.
// It is a harness, not a proxy for production traffic: it listens and
// forwards on loopback addresses only. Floor is its counterpart on the
// EPP's side, a no-op ext_proc server that measures what the exchange costs
// without the EPP.
package testgw

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/omnious/provider-node/extproc"
	"github.com/omnious/provider-node/internal/opt"
)

// HeaderSubsetHint is a request header the gateway turns into Envoy's
// subset hint metadata (a comma-separated ip:port list); test use only.
const HeaderSubsetHint = "x-testgw-subset-hint"

// HeaderTag is a request header the gateway reports as Timing.Tag and does
// not forward upstream: a test's name for the request, so that what served
// it can be told apart by kind; test use only.
const HeaderTag = "x-testgw-tag"

// Config configures the gateway; zero values take the defaults
// (WithDefaults).
type Config struct {
	// Listen is the loopback HTTP address. Default "127.0.0.1:0".
	Listen string `yaml:"listen"`
	// EPP is the ext_proc server's gRPC address (loopback). EPP or EPPs is
	// required.
	EPP string `yaml:"epp"`
	// EPPs are several ext_proc servers serving one pool, as the hosts of
	// one Envoy cluster (EPP, when set, is one more): each new stream goes
	// to the next healthy host in turn. A host is health-checked over gRPC
	// health on its ext_proc port, as the shipped Envoy config does, and
	// skipped for new streams after HealthUnhealthy failed checks or a
	// stream it could not open; with every host down, all are tried.
	EPPs []string `yaml:"epps"`
	// HealthInterval between health checks of each EPP host; 0 is the
	// default 2s (the shipped Envoy config's), negative turns checks off.
	// It also bounds the wait before a lost connection is tried again (2s
	// with checks off).
	HealthInterval time.Duration `yaml:"health_interval"`
	// HealthUnhealthy failed checks in a row mark a host down. Default 2.
	HealthUnhealthy int `yaml:"health_unhealthy"`
	// SkipResponse turns response processing off, as an Envoy route with
	// response_header_mode SKIP and response_body_mode NONE: the response
	// goes to the client without the EPP, which only sees its stream end
	// when the response has.
	SkipResponse bool `yaml:"skip_response"`
	// ChunkSize is the body chunk size sent to the EPP. Default 64 KiB.
	ChunkSize int `yaml:"chunk_size"`
	// DialTimeout bounds one connect attempt to an endpoint. Default 2s.
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// OnExchange, when set, is called at the end of every request with the
	// time it spent waiting on the EPP (the load bench's added latency),
	// the EPP host it went to and how it ended; a request whose stream
	// could open on no host is reported too (EPP empty).
	OnExchange func(Timing) `yaml:"-"`
	// Upstream, when set, carries the requests to the endpoints instead of
	// a loopback HTTP transport: the load bench answers them in process,
	// so that its CPU goes to the ext_proc exchange it measures. Every
	// endpoint must still be a loopback address.
	Upstream http.RoundTripper `yaml:"-"`
	// GatewayMetadata, when set, is written into every request's ext_proc
	// metadata namespace extproc.MetadataGateway, as the shipped Envoy
	// config does with the band and tenant its route sets: what the EPP's
	// extproc.gateway_headers trusts. Default none.
	GatewayMetadata map[string]string `yaml:"-"`
}

// Timing is what one request spent waiting on the EPP, as the gateway saw
// it: the latency the EPP adds to the request.
type Timing struct {
	// Request runs from sending the request headers to receiving the last
	// re-emitted body chunk (or the immediate response): the time the
	// request is held before it can go upstream. It includes streaming the
	// body to the EPP and back, as with Envoy in FULL_DUPLEX_STREAMED.
	Request time.Duration
	// Response is the response phase's wait: from sending the response
	// headers to their answer, plus from sending the upstream body's last
	// chunk to receiving the EPP's last chunk. Zero when the request never
	// went upstream.
	Response time.Duration
	// Status is the HTTP status the client got.
	Status int
	// Served is the endpoint that answered ("" when none did).
	Served string
	// EPP is the ext_proc host the request's stream went to ("" when no
	// stream could be opened).
	EPP string
	// Tag is the request's HeaderTag, as the client sent it.
	Tag string
	// Err is why the exchange failed (nil: it completed). After the
	// response status reached the client a failure aborts the client's
	// connection, so the client sees a truncated response.
	Err error
}

// WithDefaults returns c with every unset (zero, never a legal setting)
// field at its default.
func (c Config) WithDefaults() Config {
	opt.Zero(&c.Listen, "127.0.0.1:0")
	opt.Zero(&c.ChunkSize, 64<<10)
	opt.Zero(&c.DialTimeout, 2*time.Second)
	opt.Zero(&c.HealthInterval, 2*time.Second)
	opt.Zero(&c.HealthUnhealthy, 2)
	if c.EPP != "" && !slices.Contains(c.EPPs, c.EPP) {
		c.EPPs = append([]string{c.EPP}, c.EPPs...)
	}
	return c
}

// Gateway is a running test gateway.
type Gateway struct {
	cfg      Config
	log      *zap.Logger
	epps     *cluster
	lis      net.Listener
	upstream *http.Client
}

// New listens on cfg.Listen and connects to the EPP (lazily, as gRPC does).
func New(cfg Config, log *zap.Logger) (*Gateway, error) {
	cfg = cfg.WithDefaults()
	if err := requireLoopback(cfg.Listen); err != nil {
		return nil, fmt.Errorf("cannot listen: %w", err)
	}
	if len(cfg.EPPs) == 0 {
		return nil, errors.New("cannot use the EPP: no address")
	}
	reconnect := cfg.HealthInterval
	if reconnect <= 0 {
		reconnect = Config{}.WithDefaults().HealthInterval
	}
	epps, err := newCluster(cfg.EPPs, reconnect, log)
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		epps.close()
		return nil, fmt.Errorf("cannot listen: %w", err)
	}
	var tr http.RoundTripper = cfg.Upstream
	if tr == nil {
		dialer := &net.Dialer{Timeout: cfg.DialTimeout}
		tr = &http.Transport{
			Proxy:               nil,
			DialContext:         dialer.DialContext,
			DisableCompression:  true,
			MaxIdleConnsPerHost: 64,
		}
	}
	return &Gateway{cfg: cfg, log: log, epps: epps, lis: lis,
		upstream: &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}, nil
}

// Addr is the gateway's HTTP address.
func (g *Gateway) Addr() string { return g.lis.Addr().String() }

// OpenStreams is how many ext_proc streams are open on each EPP host, by
// address: a stream counts from its opening to the end of its exchange
// (after OnExchange has been called), so a host's count falls to 0 only
// once every request it carried has ended for the gateway.
func (g *Gateway) OpenStreams() map[string]int { return g.epps.openStreams() }

// Run serves until ctx ends, then shuts down and closes the EPP connections.
func (g *Gateway) Run(ctx context.Context) error {
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(g.lis) }()
	hctx, stopHealth := context.WithCancel(ctx)
	defer stopHealth()
	if g.cfg.HealthInterval > 0 {
		go g.epps.check(hctx, g.cfg.HealthInterval, g.cfg.HealthUnhealthy)
	}
	var err error
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = srv.Shutdown(sctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			// A connection a client left half-written (it cancelled a
			// request mid-headers and kept the socket) counts as active
			// until ReadHeaderTimeout; as Envoy at the end of its drain,
			// close what is left.
			g.log.Warn("closing connections still open after the shutdown grace")
			err = srv.Close()
		}
		<-errc
	case err = <-errc:
	}
	g.upstream.CloseIdleConnections()
	stopHealth()
	if cerr := g.epps.close(); err == nil {
		err = cerr
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

func requireLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%s is not a loopback address", addr)
	}
	return nil
}

// exchange is one request's ext_proc stream. Its messages are received on
// the request's goroutine, as Envoy handles a stream on one worker thread:
// a goroutine in between would add a hand-off to every answer the gateway
// waits on.
type exchange struct {
	g      *Gateway
	stream grpc.BidiStreamingClient[extprocv3.ProcessingRequest, extprocv3.ProcessingResponse]
	cancel context.CancelFunc // ends the stream, and any Recv waiting on it
	start  time.Time
	timing Timing
	// respEOS is when the upstream body's last chunk was handed to the
	// EPP; written by the response sendBody goroutine before it returns.
	respEOS time.Time
	// committed is set once the response status went to the client: a
	// failure after it can only abort the client's connection.
	committed bool
}

// ServeHTTP runs one request through the EPP and the chosen endpoint.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	tag := r.Header.Get(HeaderTag)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	h, stream, err := g.epps.open(ctx)
	if err != nil {
		// Fail-closed, as Envoy with failure_mode_allow: false.
		err = fmt.Errorf("ext_proc unavailable: %w", err)
		http.Error(w, err.Error(), http.StatusInternalServerError)
		if g.cfg.OnExchange != nil {
			g.cfg.OnExchange(Timing{Status: http.StatusInternalServerError, Err: err, Tag: tag})
		}
		return
	}
	defer h.open.Add(-1) // after OnExchange, even when the handler aborts
	x := &exchange{g: g, stream: stream, cancel: cancel, start: start, timing: Timing{EPP: h.addr, Tag: tag}}
	err = x.run(w, r)
	if err != nil {
		g.log.Debug("exchange failed", zap.String("path", r.URL.Path), zap.String("epp", h.addr), zap.Error(err))
	}
	cancel()
	x.timing.Err = err
	if g.cfg.OnExchange != nil {
		g.cfg.OnExchange(x.timing)
	}
	if err != nil && x.committed {
		// The status and maybe part of the body reached the client (the
		// upstream or the EPP broke off mid-response): as Envoy resets the
		// downstream stream, abort the client's connection without ending
		// the chunked body, so the client sees a truncated response, not
		// a clean end.
		panic(http.ErrAbortHandler)
	}
}

// errUpstreamBroke marks a response the upstream broke off after the
// gateway had started sending it to the client.
var errUpstreamBroke = errors.New("upstream broke off the response")

func (x *exchange) run(w http.ResponseWriter, r *http.Request) error {
	headersOnly := r.ContentLength == 0 || (r.ContentLength < 0 && (r.Method == http.MethodGet || r.Method == http.MethodHead))
	respMode := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	if x.g.cfg.SkipResponse {
		respMode = filterv3.ProcessingMode_NONE
	}
	first := &extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: respMode},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: requestHeaderMap(r), EndOfStream: headersOnly}},
	}
	if hint := r.Header.Get(HeaderSubsetHint); hint != "" {
		var list []any
		for _, a := range strings.Split(hint, ",") {
			list = append(list, strings.TrimSpace(a))
		}
		s, _ := structpb.NewStruct(map[string]any{extproc.KeySubset: list})
		first.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{extproc.MetadataSubset: s}}
	}
	if len(x.g.cfg.GatewayMetadata) > 0 {
		fields := make(map[string]any, len(x.g.cfg.GatewayMetadata))
		for k, v := range x.g.cfg.GatewayMetadata {
			fields[k] = v
		}
		s, _ := structpb.NewStruct(fields)
		if first.MetadataContext == nil {
			first.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
		}
		first.MetadataContext.FilterMetadata[extproc.MetadataGateway] = s
	}
	if err := x.stream.Send(first); err != nil {
		return fmt.Errorf("cannot send request headers: %w", err)
	}
	sendErr := make(chan error, 1)
	if headersOnly {
		sendErr <- nil
	} else {
		go func() {
			err := x.sendBody(r.Body, true)
			sendErr <- err
			if err != nil {
				// The client went away mid-body: as Envoy resets the
				// ext_proc stream with the downstream one, so the EPP
				// stops waiting for the rest.
				x.cancel()
			}
		}()
	}

	// The routing answer: headers response (or an immediate response),
	// then the body as the EPP re-emits it.
	resp, err := x.stream.Recv()
	if err != nil {
		return x.fail(w, fmt.Errorf("no routing answer: %w", err))
	}
	if ir := resp.GetImmediateResponse(); ir != nil {
		x.timing.Request = time.Since(x.start)
		x.writeImmediate(w, ir)
		return nil
	}
	hr := resp.GetRequestHeaders()
	if hr == nil {
		return x.fail(w, fmt.Errorf("unexpected first response %T", resp.Response))
	}
	out := r.Header.Clone()
	out.Del(HeaderSubsetHint)
	out.Del(HeaderTag)
	applyMutation(out, hr.GetResponse().GetHeaderMutation())
	var body []byte
	for !headersOnly {
		resp, err := x.stream.Recv()
		if err != nil {
			return x.fail(w, fmt.Errorf("request body from the EPP: %w", err))
		}
		if ir := resp.GetImmediateResponse(); ir != nil {
			x.timing.Request = time.Since(x.start)
			x.writeImmediate(w, ir)
			return nil
		}
		if resp.GetRequestTrailers() != nil {
			break
		}
		sr := resp.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			return x.fail(w, fmt.Errorf("unexpected request body response %v", resp))
		}
		body = append(body, sr.Body...)
		if sr.EndOfStream {
			break
		}
	}
	x.timing.Request = time.Since(x.start)
	if err := <-sendErr; err != nil {
		return x.fail(w, err)
	}

	up, served, err := x.forward(r, out, body)
	if err != nil {
		// As Envoy does, the local reply still goes through the response
		// phase so the EPP learns the request failed.
		up = &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{"Content-Type": {"text/plain"}},
			Body: io.NopCloser(strings.NewReader("upstream connect error: " + err.Error()))}
	}
	defer up.Body.Close()
	x.timing.Served = served
	if x.g.cfg.SkipResponse {
		return x.passThrough(w, up)
	}
	return x.respond(w, up, served)
}

// passThrough sends the response to the client without a response phase,
// then ends the ext_proc stream as Envoy does when the HTTP stream ends.
func (x *exchange) passThrough(w http.ResponseWriter, up *http.Response) error {
	flusher := x.writeHeaders(w, up, nil)
	buf := make([]byte, 32<<10)
	var err error
	for {
		n, rerr := up.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				err = fmt.Errorf("client went away: %w", werr)
				break
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			err = fmt.Errorf("%w: %w", errUpstreamBroke, rerr)
			break
		}
	}
	if err != nil {
		return err
	}
	x.closeSend()
	return nil
}

// closeSend half-closes the ext_proc stream once the client has its whole
// response. A stream that fails now has nothing left to affect (the EPP
// may have gone after its last answer), so it is logged, not an error.
func (x *exchange) closeSend() {
	if err := x.stream.CloseSend(); err != nil {
		x.g.log.Debug("cannot close the ext_proc stream after the response", zap.Error(err))
	}
}

// singleTries is how often a single destination is tried: the shipped
// Envoy route's retry policy (deploy/envoy: connect failures, resets and
// 503, num_retries 2), whose ORIGINAL_DST cluster re-reads the same
// destination on every retry (e2e/envoy TestReplica503Retried).
const singleTries = 3

// forward sends the request to the first endpoint that accepts it, walking
// the fallback list on a connect failure or a 5xx; a single destination is
// tried singleTries times on a connect failure or a 503, as Envoy retries
// it.
func (x *exchange) forward(r *http.Request, h http.Header, body []byte) (*http.Response, string, error) {
	dest := h.Get(extproc.HeaderDestination)
	if dest == "" {
		return nil, "", errors.New("the EPP set no destination")
	}
	eps := strings.Split(dest, ",")
	single := len(eps) == 1
	if single {
		eps = slices.Repeat(eps, singleTries)
	}
	var lastErr error
	for i, ep := range eps {
		ep = strings.TrimSpace(ep)
		if err := requireLoopback(ep); err != nil {
			lastErr = err
			continue
		}
		req, err := http.NewRequestWithContext(r.Context(), r.Method, "http://"+ep+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			return nil, "", err
		}
		for k, vs := range h {
			if hopByHop(k) {
				continue
			}
			req.Header[k] = vs
		}
		// As Envoy 1.40 forwards a FULL_DUPLEX_STREAMED body: chunked,
		// whatever Content-Length the EPP set (e2e/envoy TestBodySizes).
		req.ContentLength = -1
		if len(body) == 0 {
			req.ContentLength = 0
		}
		req.Header.Del("Content-Length")
		resp, err := x.g.upstream.Do(req)
		if err != nil {
			lastErr = err
			continue
		}
		retry := resp.StatusCode >= 500
		if single {
			retry = resp.StatusCode == http.StatusServiceUnavailable
		}
		if retry && i < len(eps)-1 {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			lastErr = fmt.Errorf("%s answered %d", ep, resp.StatusCode)
			continue
		}
		return resp, ep, nil
	}
	return nil, "", lastErr
}

// writeHeaders sends the client the upstream's status and end-to-end
// headers with m (the EPP's response-header mutation, nil for none)
// applied; the client's response is committed from here on. It returns
// the writer's flusher, nil if it has none.
func (x *exchange) writeHeaders(w http.ResponseWriter, up *http.Response, m *extprocv3.HeaderMutation) http.Flusher {
	h := w.Header()
	for k, vs := range up.Header {
		if !hopByHop(k) {
			h[k] = vs
		}
	}
	applyMutation(h, m)
	x.timing.Status = up.StatusCode
	x.committed = true
	w.WriteHeader(up.StatusCode)
	flusher, _ := w.(http.Flusher)
	return flusher
}

// respond runs the response phase: headers, then body chunks as they come
// from the endpoint, each written to the client as the EPP returns it.
func (x *exchange) respond(w http.ResponseWriter, up *http.Response, served string) error {
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(strconv.Itoa(up.StatusCode))}}}
	for k, vs := range up.Header {
		for _, v := range vs {
			hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: strings.ToLower(k), RawValue: []byte(v)})
		}
	}
	req := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: hm}}}
	if served != "" {
		s, _ := structpb.NewStruct(map[string]any{extproc.KeyServed: served})
		req.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{extproc.MetadataLB: s}}
	}
	sent := time.Now()
	if err := x.stream.Send(req); err != nil {
		return x.fail(w, fmt.Errorf("cannot send response headers: %w", err))
	}
	resp, err := x.stream.Recv()
	if err != nil {
		return x.fail(w, fmt.Errorf("no response headers answer: %w", err))
	}
	x.timing.Response = time.Since(sent)
	if ir := resp.GetImmediateResponse(); ir != nil {
		x.writeImmediate(w, ir)
		return nil
	}
	flusher := x.writeHeaders(w, up, resp.GetResponseHeaders().GetResponse().GetHeaderMutation())
	if flusher != nil {
		flusher.Flush() // as Envoy, send the headers on before the body
	}

	sendErr := make(chan error, 1)
	go func() {
		err := x.sendBody(up.Body, false)
		sendErr <- err
		if err != nil {
			x.cancel() // wake the Recv below, which then finds err
		}
	}()
	for {
		resp, err := x.stream.Recv()
		if err != nil {
			x.cancel()
			var serr error
			select {
			case serr = <-sendErr:
			default: // the EPP failed, not the upstream
			}
			if serr != nil {
				// The upstream broke mid-response (reset, engine crash).
				// Bytes have reached the client, so there is no retry: as
				// Envoy does, reset the client's stream and end the
				// ext_proc stream, so the EPP reports the failure.
				return fmt.Errorf("%w: %w", errUpstreamBroke, serr)
			}
			return fmt.Errorf("response body from the EPP: %w", err)
		}
		sr := resp.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			return fmt.Errorf("unexpected response body answer %v", resp)
		}
		if len(sr.Body) > 0 {
			if _, err := w.Write(sr.Body); err != nil {
				return fmt.Errorf("client went away: %w", err)
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if sr.EndOfStream {
			break
		}
	}
	last := time.Now()
	if err := <-sendErr; err != nil {
		return err
	}
	if !x.respEOS.IsZero() && last.After(x.respEOS) {
		x.timing.Response += last.Sub(x.respEOS)
	}
	x.closeSend()
	return nil
}

// sendBody streams body to the EPP in ChunkSize pieces as they are read,
// the last one (possibly empty) with end_of_stream.
func (x *exchange) sendBody(body io.Reader, request bool) error {
	buf := make([]byte, x.g.cfg.ChunkSize)
	for {
		n, err := io.ReadAtLeast(body, buf, 1)
		eos := err != nil
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("cannot read body: %w", err)
		}
		hb := &extprocv3.HttpBody{Body: append([]byte(nil), buf[:n]...), EndOfStream: eos}
		msg := &extprocv3.ProcessingRequest{}
		if request {
			msg.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: hb}
		} else {
			msg.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: hb}
			if eos {
				x.respEOS = time.Now()
			}
		}
		if err := x.stream.Send(msg); err != nil {
			return fmt.Errorf("cannot send body: %w", err)
		}
		if eos {
			return nil
		}
	}
}

func (x *exchange) fail(w http.ResponseWriter, err error) error {
	if x.timing.Status == 0 { // nothing written yet
		x.timing.Status = http.StatusBadGateway
		http.Error(w, "gateway: "+err.Error(), http.StatusBadGateway)
	}
	return err
}

func (x *exchange) writeImmediate(w http.ResponseWriter, ir *extprocv3.ImmediateResponse) {
	x.timing.Status = writeImmediate(w, ir)
}

func requestHeaderMap(r *http.Request) *corev3.HeaderMap {
	hm := &corev3.HeaderMap{}
	add := func(k, v string) { hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)}) }
	add(":method", r.Method)
	add(":path", r.URL.RequestURI())
	add(":authority", r.Host)
	add(":scheme", "http")
	if r.ContentLength >= 0 {
		add("content-length", strconv.FormatInt(r.ContentLength, 10))
	}
	for k, vs := range r.Header {
		if hopByHop(k) {
			continue
		}
		for _, v := range vs {
			add(strings.ToLower(k), v)
		}
	}
	return hm
}

func writeImmediate(w http.ResponseWriter, ir *extprocv3.ImmediateResponse) int {
	applyMutation(w.Header(), ir.GetHeaders())
	code := int(ir.GetStatus().GetCode())
	if code == 0 {
		code = http.StatusOK
	}
	w.WriteHeader(code)
	_, _ = w.Write(ir.GetBody())
	return code
}

func hopByHop(k string) bool {
	switch http.CanonicalHeaderKey(k) {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Te", "Trailer", "Upgrade", "Content-Length", "Host":
		return true
	}
	return false
}
