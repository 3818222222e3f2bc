package extproc

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.yaml.in/yaml/v3"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/internal/testutil/conftest"
	"github.com/omnious/provider-node/scheduler"
)

// TestREADMEDefaults keeps the README's configuration table equal to
// WithDefaults of an empty config.
func TestREADMEDefaults(t *testing.T) {
	conftest.Check(t, conftest.Table(t, "README.md", "Configuration", "key", "default"), 0, 1, conftest.Fields(Config{}.WithDefaults()), nil)
}

// TestZeroIsASetting: a key whose zero is legal keeps an explicit zero.
func TestZeroIsASetting(t *testing.T) {
	for _, key := range []string{"max_endpoints"} {
		t.Run(key, func(t *testing.T) {
			doc := conftest.ZeroYAML(key, conftest.Lookup(t, conftest.Fields(Config{}.WithDefaults()), key))
			var c Config
			dec := yaml.NewDecoder(bytes.NewReader([]byte(doc)))
			dec.KnownFields(true)
			require.NoError(t, dec.Decode(&c), doc)
			c = c.WithDefaults()
			require.NoError(t, c.Validate())
			require.True(t, conftest.IsZero(conftest.Lookup(t, conftest.Fields(c), key)), "%s after defaults", doc)
		})
	}
}

// TestMaxEndpoints: one endpoint by default, as Envoy's ORIGINAL_DST
// cluster needs; 0 is every endpoint of the decision.
func TestMaxEndpoints(t *testing.T) {
	tests := []struct {
		name string
		max  *int
		want int
	}{
		{"default", nil, 1},
		{"every endpoint", new(0), 3},
		{"two", new(2), 2},
		{"more than the decision has", new(5), 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewServer(Config{MaxEndpoints: tt.max}, nil, nil, nil, zap.NewNop())
			st := &stream{s: s}
			d := &scheduler.Decision{Endpoints: []*endpoint.Endpoint{{Addr: "10.0.0.1:8000"}, {Addr: "10.0.0.2:8000"}, {Addr: "10.0.0.3:8000"}}}
			require.Len(t, strings.Split(st.destination(d), ","), tt.want)
		})
	}
}
