package epp

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/omnious/provider-node/"

// goList maps each of the module's packages to what it imports, with its
// tests' imports when tests is set.
func goList(t *testing.T, tests bool) map[string][]string {
	t.Helper()
	args := []string{"list", "-deps", "-f", "{{.ImportPath}}: {{join .Imports \" \"}}", module + "..."}
	if tests {
		args = append(args[:1], append([]string{"-test"}, args[1:]...)...)
	}
	out, err := exec.Command("go", args...).Output()
	require.NoError(t, err, "go list")
	imports := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		pkg, deps, _ := strings.Cut(strings.TrimSpace(line), ": ")
		if !strings.HasPrefix(pkg, module) {
			continue
		}
		// "pkg [pkg.test]" is the package compiled with its tests;
		// "pkg.test" is the generated main that runs them.
		pkg, _, _ = strings.Cut(pkg, " ")
		if strings.HasSuffix(pkg, ".test") {
			continue
		}
		imports[pkg] = append(imports[pkg], strings.Fields(deps)...)
	}
	require.NotEmpty(t, imports)
	return imports
}

// under reports whether the module-relative path rel is dir or inside it.
func under(rel, dir string) bool { return rel == dir || strings.HasPrefix(rel, dir+"/") }

// lab holds the packages that test and measure the product: nothing the
// product ships imports them.
var lab = []string{"bench", "cmd/bench", "internal/testutil", "docs"}

func isLab(rel string) bool {
	for _, d := range lab {
		if under(rel, d) {
			return true
		}
	}
	return false
}

// TestLayering keeps the data flow one way: discovery and the scheduler
// meet only in the endpoint leaf, the ext_proc server knows neither
// discovery nor ingestion, and nothing the assembly composes imports it.
// The product, tests included, imports nothing of the bench, nothing
// imports docs/, and only tests and the lab import the test helpers. In
// the bench, the comparison and the capacity proof do not import each
// other, and the rig under them imports neither.
func TestLayering(t *testing.T) {
	imports := goList(t, true)
	for pkg, deps := range imports {
		rel := strings.TrimPrefix(pkg, module)
		for _, d := range deps {
			drel, ok := strings.CutPrefix(strings.TrimSuffix(d, "_test"), module)
			if !ok || under(drel, rel) {
				continue
			}
			if under(drel, "docs") || (!isLab(rel) && (under(drel, "bench") || under(drel, "cmd/bench"))) {
				t.Errorf("%s imports %s", rel, drel)
			}
		}
	}
	for pkg, deps := range goList(t, false) {
		rel := strings.TrimPrefix(pkg, module)
		for _, d := range deps {
			drel, ok := strings.CutPrefix(d, module)
			if ok && !isLab(rel) && under(drel, "internal/testutil") && !strings.HasSuffix(rel, "test") {
				t.Errorf("%s imports the test helper %s outside its tests", rel, drel)
			}
		}
	}
	forbidden := []struct{ from, to string }{
		{"discovery", "scheduler"},
		{"endpoint", ""}, // a leaf: no project imports at all
		{"rules", ""},    // a leaf too: sources and the server meet in it
		{"extproc", "discovery"},
		{"extproc", "kvindex/ingest"},
		{"extproc", "epp"},
		{"scheduler", "epp"},
		{"scheduler", "discovery"},
		{"scheduler", "kvindex/ingest"},
		{"kvindex", "scheduler"},
		{"kvindex", "epp"},
		{"discovery", "epp"},
		{"engines", "kvindex"},
		{"capacity", "scheduler"},
		{"quoter", "epp"},
		{"quoter", "scheduler"}, // the quoter reads only the capacity snapshot
		{"quoter", "kvindex"},
		// The bench's comparison and capacity proof both stand on its rig
		// and not on each other; the rig knows neither.
		{"bench/compare", "bench/proof"},
		{"bench/proof", "bench/compare"},
		{"bench/rig", "bench/compare"},
		{"bench/rig", "bench/proof"},
	}
	for pkg, deps := range imports {
		// An external test package (pkg_test) is held to its package's rules.
		rel := strings.TrimSuffix(strings.TrimPrefix(pkg, module), "_test")
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
