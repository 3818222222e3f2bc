// Package launchtest builds the binaries that the bench's process tests
// run, as engines/sim/simtest does enginesim.
package launchtest

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// EPPBinary builds cmd/epp into a directory the test owns and returns the
// binary's path.
func EPPBinary(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	bin := filepath.Join(t.TempDir(), "epp")
	out, err := exec.Command("go", "build", "-o", bin, filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "cmd", "epp")).CombinedOutput()
	require.NoError(t, err, string(out))
	return bin
}
