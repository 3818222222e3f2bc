package extproc

import (
	"errors"
	"fmt"
	"math"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"

	"github.com/omnious/provider-node/internal/opt"
)

// Config configures the ext_proc server. Every default is applied in
// WithDefaults. MaxEndpoints, whose zero is a setting, is a pointer (nil =
// unset); for the other fields zero means unset.
type Config struct {
	// MaxBodyBytes bounds a request body; larger ones get 413. Default
	// (0) 32 MiB; negative is refused.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// InjectUsage asks the engine for stream usage
	// (stream_options.include_usage) when a streaming client did not, so
	// token accounting works for every request; the extra usage chunk is
	// removed again before it reaches that client. Default true.
	InjectUsage *bool `yaml:"inject_usage"`
	// ChunkSize is the largest body chunk re-emitted to Envoy. Default
	// 62000 bytes, under Envoy's 64 KiB per-message buffer.
	ChunkSize int `yaml:"chunk_size"`
	// MaxEndpoints caps how many endpoints of a decision go into
	// x-gateway-destination-endpoint (primary then fallbacks); 0 sends
	// every endpoint the scheduler returns. Default 1: the shipped Envoy
	// config (deploy/envoy) routes with an ORIGINAL_DST cluster, which
	// accepts exactly one ip:port, and a list there fails the request.
	// Gateways that walk fallback lists (override_host, the test gateway)
	// take 0 or a larger cap.
	MaxEndpoints *int `yaml:"max_endpoints"`
	// DefaultBodyMode is the request body mode assumed when Envoy does not
	// announce it (protocol_config is sent by Envoy 1.33+):
	// "FULL_DUPLEX_STREAMED" or "BUFFERED". Default "FULL_DUPLEX_STREAMED".
	DefaultBodyMode string `yaml:"default_body_mode"`
	// SessionHeader carries the session-affinity key; the body's "user"
	// field is used when it is absent. Default "x-session-id".
	SessionHeader string `yaml:"session_header"`
	// BandHeader names the flow-control band (the Inference Extension's
	// objective header). Default "x-gateway-inference-objective".
	BandHeader string `yaml:"band_header"`
	// TenantHeader is the fairness and usage key. Default
	// "x-gateway-inference-fairness-id".
	TenantHeader string `yaml:"tenant_header"`
	// GatewayHeaders takes the band and tenant only from the gateway: the
	// ext_proc request's metadata namespace MetadataGateway, keyed by the
	// header names, which a client cannot write (the shipped Envoy configs
	// move their route's values there after removing the client's
	// headers). Request headers of those names are then ignored, and
	// x-omnious-calibration too (only the calibration token counts). The
	// client's session header (or "user" field) still names its sessions,
	// scoped to the gateway's tenant; a session in the metadata replaces
	// it. Default false: the headers are read as they arrive
	// (TestGatewayHeaders, TestGatewaySessionScoped).
	GatewayHeaders bool `yaml:"gateway_headers"`
	// CalibrationTokenFile holds the secret the calibration Job sends in
	// x-omnious-calibration-token; with it, only a request carrying it
	// counts as calibration, and x-omnious-calibration is ignored.
	// Default "": x-omnious-calibration: 1 marks calibration (unless
	// GatewayHeaders).
	CalibrationTokenFile string `yaml:"calibration_token_file"`
	// MaxRecvMsgSize and MaxSendMsgSize bound one gRPC message. A BUFFERED
	// request arrives as one message, so the receive limit must exceed
	// MaxBodyBytes. Default (0) 64 MiB each; negative is refused.
	MaxRecvMsgSize int `yaml:"max_recv_msg_size"`
	MaxSendMsgSize int `yaml:"max_send_msg_size"`
	// RequestIdleTimeout bounds the wait for Envoy's next message while a
	// request is gathered (from the stream's start until its body ended):
	// a client that sends headers and then nothing gets 408 and the stream
	// is closed, so a slow client cannot hold a stream and its buffers.
	// Default 30s; negative disables it (0 is unset, not "no wait").
	RequestIdleTimeout time.Duration `yaml:"request_idle_timeout"`
	// ResponseIdleTimeout bounds the wait for Envoy's next message once the
	// request went upstream. Response headers of a non-streaming request
	// come only when generation ends, so it must exceed the longest
	// generation; the stream then ends with DeadlineExceeded and the
	// scheduler hears the request failed. Default 1h; negative disables it
	// (0 is unset).
	ResponseIdleTimeout time.Duration `yaml:"response_idle_timeout"`
}

// Default idle timeouts of an ext_proc stream (see Config).
const (
	DefaultRequestIdleTimeout  = 30 * time.Second
	DefaultResponseIdleTimeout = time.Hour
)

// Body modes accepted in DefaultBodyMode.
const (
	ModeFullDuplex = "FULL_DUPLEX_STREAMED"
	ModeBuffered   = "BUFFERED"
)

// defaultMaxEndpoints is Config.MaxEndpoints' default: one destination,
// as Envoy's ORIGINAL_DST cluster needs.
const defaultMaxEndpoints = 1

// WithDefaults returns c with every unset field at its default; pointer
// fields are fresh copies.
func (c Config) WithDefaults() Config {
	opt.Zero(&c.MaxBodyBytes, 32<<20)
	c.InjectUsage = opt.Or(c.InjectUsage, true)
	opt.Zero(&c.ChunkSize, 62000)
	c.MaxEndpoints = opt.Or(c.MaxEndpoints, defaultMaxEndpoints)
	opt.Zero(&c.DefaultBodyMode, ModeFullDuplex)
	opt.Zero(&c.SessionHeader, "x-session-id")
	opt.Zero(&c.BandHeader, "x-gateway-inference-objective")
	opt.Zero(&c.TenantHeader, "x-gateway-inference-fairness-id")
	opt.Zero(&c.MaxRecvMsgSize, 64<<20)
	opt.Zero(&c.MaxSendMsgSize, 64<<20)
	opt.Zero(&c.RequestIdleTimeout, DefaultRequestIdleTimeout)
	opt.Zero(&c.ResponseIdleTimeout, DefaultResponseIdleTimeout)
	return c
}

// Validate reports a configuration that cannot work. Call it on the result
// of WithDefaults.
func (c Config) Validate() error {
	var errs []error
	if c.InjectUsage == nil || c.MaxEndpoints == nil {
		return errors.New("inject_usage or max_endpoints unset: Validate wants a config from WithDefaults")
	}
	errs = append(errs, opt.DefaultNonNegative("max_body_bytes", c.MaxBodyBytes, 32<<20),
		opt.DefaultNonNegative("chunk_size", c.ChunkSize, 62000),
		opt.NonNegative("max_endpoints", *c.MaxEndpoints),
		opt.DefaultNonNegative("max_recv_msg_size", c.MaxRecvMsgSize, 64<<20),
		opt.DefaultNonNegative("max_send_msg_size", c.MaxSendMsgSize, 64<<20))
	if c.ChunkSize > 64<<10 {
		errs = append(errs, fmt.Errorf("chunk_size %d must be at most 65536", c.ChunkSize))
	}
	if c.DefaultBodyMode != ModeFullDuplex && c.DefaultBodyMode != ModeBuffered {
		errs = append(errs, fmt.Errorf("default_body_mode %q is not %s or %s", c.DefaultBodyMode, ModeFullDuplex, ModeBuffered))
	}
	if c.MaxRecvMsgSize > 0 && int64(c.MaxRecvMsgSize) < c.MaxBodyBytes && c.MaxBodyBytes < math.MaxInt32 {
		errs = append(errs, fmt.Errorf("max_recv_msg_size %d is below max_body_bytes %d: a BUFFERED body arrives in one message", c.MaxRecvMsgSize, c.MaxBodyBytes))
	}
	return errors.Join(errs...)
}

// ServerOptions are the gRPC options the ext_proc listener needs: message
// size limits large enough for multimodal requests, and a buffer pool with
// a tier at every power of two for both the transport and the codec.
func (c Config) ServerOptions() []grpc.ServerOption {
	pool := NewBufferPool()
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(c.MaxRecvMsgSize),
		grpc.MaxSendMsgSize(c.MaxSendMsgSize),
		// Bodies stream in 64 KiB chunks: windows wider than gRPC's 64 KiB
		// default keep a 200 KB prompt from waiting on WINDOW_UPDATEs.
		grpc.InitialWindowSize(1 << 20),
		grpc.InitialConnWindowSize(16 << 20),
		grpc.ReadBufferSize(128 << 10),
		grpc.WriteBufferSize(128 << 10),
		experimental.BufferPool(pool),
		grpc.ForceServerCodecV2(NewCodec(pool)),
	}
}

// NewBufferPool returns a gRPC buffer pool for body-sized messages
// (msgPool). gRPC's default pool jumps from 32 KiB to 1 MiB buffers and
// zeroes the whole buffer on every Get, so each 33 KiB body chunk cleared
// a megabyte; with a tier at every power of two up to 64 MiB a buffer is
// at most twice the message.
func NewBufferPool() mem.BufferPool { return new(msgPool) }
