package scheduler

import (
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/internal/testutil/conftest"
)

// TestREADMEListsEveryKey keeps the README's configuration table in step
// with Config: every YAML key must have a row.
func TestREADMEListsEveryKey(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	var keys []string
	var walk func(prefix string, typ reflect.Type)
	walk = func(prefix string, typ reflect.Type) {
		for f := range typ.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "" || name == "-" {
				continue
			}
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct && ft != reflect.TypeFor[Band]() && !strings.HasPrefix(ft.PkgPath(), "time") {
				walk(prefix+name+".", ft)
				continue
			}
			keys = append(keys, prefix+name)
		}
	}
	walk("", reflect.TypeFor[Config]())
	require.Greater(t, len(keys), 30)
	for _, k := range keys {
		require.Contains(t, string(readme), "| `"+k+"` |", "README.md has no row for %s", k)
	}
}

// TestREADMEDefaults keeps the defaults the README's configuration table
// gives equal to WithDefaults of an empty config.
func TestREADMEDefaults(t *testing.T) {
	rows := conftest.Table(t, "README.md", "Configuration", "key", "default")
	bands := func(v reflect.Value) string {
		var s []string
		for _, b := range v.Interface().([]Band) {
			s = append(s, fmt.Sprintf("%s %d/%.2f", b.Name, b.Priority, b.SaturationCeiling))
		}
		return strings.Join(s, ", ")
	}
	conftest.Check(t, rows, 0, 1, conftest.Fields(Config{}.WithDefaults()),
		map[string]conftest.Custom{"admission.bands": bands})
}
