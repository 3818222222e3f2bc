package epp

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/omnious/provider-node/internal/opt"
)

// TracingConfig exports one span per request ("epp.request", see package
// extproc) over OTLP/gRPC. Tracing is off unless OTLPEndpoint is set.
type TracingConfig struct {
	// OTLPEndpoint is the collector's OTLP/gRPC address, host:port.
	// Default empty: no tracing, and the client's trace headers pass
	// through untouched.
	OTLPEndpoint string `yaml:"otlp_endpoint"`
	// Insecure sends spans without TLS (a collector on the same host or
	// pod). Default false.
	Insecure bool `yaml:"insecure"`
	// SampleRatio is the share of traces the EPP starts that it records,
	// 0..1 (0 records only the clients' sampled traces). A request carrying
	// a client trace follows the client's sampling decision instead
	// (parent-based). Default 0.1.
	SampleRatio *float64 `yaml:"sample_ratio"`
	// ServiceName is the spans' service.name. Default "omnious-epp".
	ServiceName string `yaml:"service_name"`
}

// DefaultTraceSampleRatio is TracingConfig.SampleRatio's default.
const DefaultTraceSampleRatio = 0.1

// WithDefaults returns c with every unset field at its default; the
// sample ratio is a fresh copy.
func (c TracingConfig) WithDefaults() TracingConfig {
	c.SampleRatio = opt.Or(c.SampleRatio, DefaultTraceSampleRatio)
	opt.Zero(&c.ServiceName, "omnious-epp")
	return c
}

func (c TracingConfig) validate() error {
	if c.SampleRatio == nil {
		return errors.New("tracing.sample_ratio unset: Validate wants a config from WithDefaults")
	}
	if r := *c.SampleRatio; r < 0 || r > 1 {
		return fmt.Errorf("tracing.sample_ratio %g is not in [0, 1]", r)
	}
	return nil
}

// newTracerProvider builds the exporter and provider; nil when tracing is
// off. The exporter connects lazily: an unreachable collector costs spans,
// never requests.
func newTracerProvider(c TracingConfig) (*sdktrace.TracerProvider, error) {
	if c.OTLPEndpoint == "" {
		return nil, nil
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(c.OTLPEndpoint)}
	if c.Insecure {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	exp, err := otlptracegrpc.New(context.Background(), opts...)
	if err != nil {
		return nil, fmt.Errorf("cannot create the OTLP trace exporter: %w", err)
	}
	res := resource.NewSchemaless(attribute.String("service.name", c.ServiceName))
	return sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(*c.SampleRatio))),
	), nil
}

// shutdownTracing flushes the spans still queued.
func shutdownTracing(ctx context.Context, tp *sdktrace.TracerProvider) error {
	if tp == nil {
		return nil
	}
	if err := tp.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("cannot flush spans: %w", err)
	}
	return nil
}
