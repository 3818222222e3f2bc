package pyenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEnvoyRuns(t *testing.T) {
	out, err := exec.Command(MustEnvoy(t), "--version").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "/1.40.0/", "the pinned Envoy is 1.40.0")
}

func TestMissingSaysHow(t *testing.T) {
	root, err := Root()
	require.NoError(t, err)
	name := "missing-" + strings.ReplaceAll(t.Name(), "/", "-")
	errFile := filepath.Join(root, ".cache", "py", name+".err")
	require.NoError(t, os.MkdirAll(filepath.Dir(errFile), 0o755))
	require.NoError(t, os.WriteFile(errFile, []byte("pip: no matching distribution\n"), 0o644))
	t.Cleanup(func() { os.Remove(errFile) })

	_, err = Dir(name)
	require.ErrorContains(t, err, "run scripts/pyenv.sh "+name)
	require.ErrorContains(t, err, "pip: no matching distribution")
}
