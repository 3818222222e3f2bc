package discovery

import (
	"testing"

	"github.com/omnious/provider-node/internal/testutil/kubetest"
)

// The rule watch against a real kube-apiserver, for llm-d-router's group
// (on the shared control plane) and for the former one (on a control plane
// of its own, since both groups cannot be installed with one set of names).
func TestRuleWatchAPIServer(t *testing.T) {
	env := kubetest.Shared(t)
	ruleWatchScenario(t, env.Kube, env.Dynamic, env.Namespace(t, "rules-llmd"), 0, func() { env.InstallCRDs(t, ruleCRDs...) })
}

func TestRuleWatchAPIServerLegacy(t *testing.T) {
	env := kubetest.Start(t, kubetest.Options{})
	legacy := legacyCRDs(t, t.TempDir())
	ruleWatchScenario(t, env.Kube, env.Dynamic, env.Namespace(t, "rules-legacy"), 1, func() { env.InstallCRDs(t, legacy...) })
}
