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
	return MustRun(t, Config{File: file, Subst: subst, Edit: edit})
}

// MustRun is MustStart for a whole Config; Bin defaults to the pinned
// Envoy and Dir to a directory of t's.
func MustRun(t testing.TB, c Config) *Envoy {
	t.Helper()
	if c.Bin == "" {
		c.Bin = pyenv.MustEnvoy(t)
	}
	if c.Dir == "" {
		c.Dir = t.TempDir()
	}
	e, err := Start(context.Background(), c)
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
