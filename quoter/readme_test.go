package quoter

import (
	"strings"
	"testing"

	"github.com/omnious/provider-node/internal/testutil/conftest"
)

// TestREADMEDefaults keeps the README's configuration table equal to
// WithDefaults of an empty config. The conformance section takes its
// defaults where the checks run (conformance.Run), and its HTTP client
// from the service.
func TestREADMEDefaults(t *testing.T) {
	c := Config{}.WithDefaults()
	c.Conformance = c.Conformance.WithDefaults()
	var fields []conftest.Field
	for _, f := range conftest.Fields(c) {
		if !strings.HasSuffix(f.Key, ".HTTP") {
			fields = append(fields, f)
		}
	}
	conftest.Check(t, conftest.Table(t, "README.md", "Configuration", "field", "default"), 0, 1, fields, nil)
}
