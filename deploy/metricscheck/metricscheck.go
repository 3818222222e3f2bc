// Package metricscheck checks a live /metrics exposition against
// deploy/metrics.txt, the list of names the dashboards, alerts and KEDA use:
// `promtool check metrics` passes on it, and every name listed for the
// component is exposed with the listed type. Tests of the EPP and the quoter
// call it on real scrapes, so a renamed metric breaks the build instead of a
// dashboard.
package metricscheck

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// listPath is deploy/metrics.txt, found from this file's location.
func listPath(t testing.TB) string {
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	return filepath.Join(filepath.Dir(file), "..", "metrics.txt")
}

// Expected returns name -> type for component ("epp", "quoter", "engine").
func Expected(t testing.TB, component string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(listPath(t))
	require.NoError(t, err)
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && !strings.HasPrefix(f[0], "#") && f[2] == component {
			out[f[0]] = f[1]
		}
	}
	require.NotEmpty(t, out, "no %s metrics in deploy/metrics.txt", component)
	return out
}

// Check runs promtool on exposition and requires every listed name of
// component with its type. promtool comes from Debian's prometheus package
// (make deps installs it).
func Check(t testing.TB, exposition []byte, component string) {
	t.Helper()
	cmd := exec.Command("promtool", "check", "metrics")
	cmd.Stdin = bytes.NewReader(exposition)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "promtool check metrics (make deps installs promtool): %s", out)

	types := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(exposition))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			types[f[2]] = f[3]
		}
	}
	for name, typ := range Expected(t, component) {
		require.Equal(t, typ, types[name], "%s metric %s (used by dashboards/alerts) is exposed as a %s", component, name, typ)
	}
}
