package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/omnious/provider-node/internal/testutil/envoytest"
	"github.com/omnious/provider-node/internal/testutil/pyenv"
)

// Envoy is the real Envoy in front of the bench's EPPs, running the
// config the project ships (deploy/envoy: envoy.yaml for one EPP,
// envoy-two-epps.yaml for two) with its ports moved to loopback.
type Envoy struct {
	e       *envoytest.Envoy
	cfgName string
	ownDir  string // removed at Close
}

// StartEnvoy runs bin on the shipped config for len(epps) EPPs (their
// ext_proc addresses; each answers gRPC health on that port too, where
// Envoy health-checks it), with its config and log in dir (a temporary
// directory when empty), and returns once Envoy is LIVE.
func StartEnvoy(ctx context.Context, bin, dir string, epps []string) (*Envoy, error) {
	var name string
	switch len(epps) {
	case 1:
		name = "envoy.yaml"
	case 2:
		name = "envoy-two-epps.yaml"
	default:
		return nil, fmt.Errorf("the shipped Envoy configs serve one or two EPPs, not %d", len(epps))
	}
	root, err := pyenv.Root()
	if err != nil {
		return nil, fmt.Errorf("cannot find deploy/envoy: %w", err)
	}
	subst := map[string]string{}
	for i, a := range epps {
		subst[fmt.Sprintf("127.0.0.1:%d", 9002+10*i)] = a
		subst[fmt.Sprintf("127.0.0.1:%d", 9003+10*i)] = a
	}
	g := &Envoy{cfgName: "deploy/envoy/" + name}
	if dir == "" {
		if dir, err = os.MkdirTemp("", "bench-envoy-"); err != nil {
			return nil, fmt.Errorf("cannot create the Envoy's directory: %w", err)
		}
		g.ownDir = dir
	}
	g.e, err = envoytest.Start(ctx, envoytest.Config{Bin: bin, File: filepath.Join(root, "deploy", "envoy", name), Subst: subst, Dir: dir})
	if err != nil {
		return nil, errors.Join(err, g.removeDir())
	}
	return g, nil
}

// URL is Envoy's listener, http://127.0.0.1:port.
func (g *Envoy) URL() string { return g.e.URL() }

// Config is the shipped config it runs, relative to the module root.
func (g *Envoy) Config() string { return g.cfgName }

// Close stops Envoy by its PID.
func (g *Envoy) Close() error {
	return errors.Join(g.e.Stop(), g.removeDir())
}

func (g *Envoy) removeDir() error {
	if g.ownDir == "" {
		return nil
	}
	return os.RemoveAll(g.ownDir)
}
