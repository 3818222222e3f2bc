package envoytest

import (
	"context"
	"testing"

	"github.com/omnious/provider-node/internal/testutil/pyenv"
)

// MustStart runs the pinned Envoy (pyenv.MustEnvoy) on file with subst,
// in a directory of t's, until t ends; edit may be nil. A failure, at
// start or at the stop, fails t with Envoy's log.
func MustStart(t testing.TB, file string, subst map[string]string, edit func(map[string]any) error) *Envoy {
	t.Helper()
	e, err := Start(context.Background(), Config{Bin: pyenv.MustEnvoy(t), File: file, Subst: subst, Dir: t.TempDir(), Edit: edit})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("envoy log (%s):\n%s", e.logPath, e.LogTail())
		}
	})
	return e
}
