package epp

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/omnious/provider-node/internal/testutil/conftest"
)

// TestREADMEDefaults keeps the EPP configuration table of the repository
// README equal to WithDefaults of an empty config; the extproc and
// scheduler sections are checked against their own READMEs.
func TestREADMEDefaults(t *testing.T) {
	rows := conftest.Table(t, "../README.md", "EPP (`cmd/epp`)", "key", "default")
	conftest.Check(t, rows, 0, 1, conftest.Fields(Config{}.WithDefaults()), map[string]conftest.Custom{
		// nil: on when the admin address is loopback (AdminConfig.debug).
		"admin.debug": func(v reflect.Value) string {
			if v.IsNil() {
				return "on loopback"
			}
			return fmt.Sprint(v.Elem().Bool())
		},
	})
}
