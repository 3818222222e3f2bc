package epp

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/omnious/provider-node/"

// TestLayering keeps the data flow one way: discovery and the scheduler
// meet only in the endpoint leaf, the ext_proc server knows neither
// discovery nor ingestion, and nothing the assembly composes imports it.
func TestLayering(t *testing.T) {
	out, err := exec.Command("go", "list", "-test", "-deps", "-f", "{{.ImportPath}}: {{join .Imports \" \"}}", module+"...").Output()
	require.NoError(t, err, "go list")
	imports := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		pkg, deps, _ := strings.Cut(strings.TrimSpace(line), ": ")
		if !strings.HasPrefix(pkg, module) {
			continue
		}
		// "pkg [pkg.test]" is the package compiled with its tests.
		pkg, _, _ = strings.Cut(pkg, " ")
		imports[pkg] = append(imports[pkg], strings.Fields(deps)...)
	}
	require.NotEmpty(t, imports)
	forbidden := []struct{ from, to string }{
		{"discovery", "scheduler"},
		{"endpoint", ""}, // a leaf: no project imports at all
		{"rules", ""},    // a leaf too: sources and the server meet in it
		{"extproc", "discovery"},
		{"extproc", "kvindex/ingest"},
		{"extproc", "internal/epp"},
		{"scheduler", "internal/epp"},
		{"scheduler", "discovery"},
		{"scheduler", "kvindex/ingest"},
		{"kvindex", "scheduler"},
		{"kvindex", "internal/epp"},
		{"discovery", "internal/epp"},
		{"engines", "kvindex"},
		{"capacity", "scheduler"},
		{"quoter", "internal/epp"},
		{"quoter", "scheduler"}, // the quoter reads only the capacity snapshot
		{"quoter", "kvindex"},
	}
	for pkg, deps := range imports {
		rel := strings.TrimPrefix(pkg, module)
		for _, f := range forbidden {
			if rel != f.from && !strings.HasPrefix(rel, f.from+"/") {
				continue
			}
			for _, d := range deps {
				drel, ok := strings.CutPrefix(strings.TrimSuffix(d, "_test"), module)
				if !ok || drel == rel || strings.HasPrefix(drel, rel+"/") {
					continue
				}
				if f.to == "" || drel == f.to || strings.HasPrefix(drel, f.to+"/") {
					t.Errorf("%s imports %s", rel, drel)
				}
			}
		}
	}
}
