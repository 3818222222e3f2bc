package discovery

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/rules"
)

// ruleCRDs are the vendored rule CRDs, relative to this package.
var ruleCRDs = []string{"../deploy/crds/llm-d.ai_inferenceobjectives.yaml", "../deploy/crds/llm-d.ai_inferencemodelrewrites.yaml"}

// legacyCRDs writes ruleCRDs under the Inference Extension's former group
// into dir and returns their paths.
func legacyCRDs(t *testing.T, dir string) []string {
	var out []string
	for _, p := range ruleCRDs {
		data, err := os.ReadFile(p)
		require.NoError(t, err)
		path := filepath.Join(dir, "legacy-"+filepath.Base(p))
		require.NoError(t, os.WriteFile(path, bytes.ReplaceAll(data, []byte("llm-d.ai"), []byte(objectiveGVRs[1].Group)), 0o644))
		out = append(out, path)
	}
	return out
}

// ruleWatchScenario runs a Pool's rule watch against a real API server in
// namespace ns, as an EPP with a kubeconfig does: the CRDs are not there
// at start (installCRDs installs them, in the group of objectiveGVRs[group],
// and waits until they are served), then objectives and rewrites are
// created, changed to invalid versions the CRD schema still admits, moved
// to another pool and deleted. Each change must reach the rules within
// changeWithin.
func ruleWatchScenario(t *testing.T, kube kubernetes.Interface, dyn dynamic.Interface, ns string, group int, installCRDs func()) {
	const changeWithin = time.Second
	store := rules.NewStore([]rules.Band{{Name: "high", Priority: 10}, {Name: "std", Priority: 0}, {Name: "low", Priority: -10}}, "std")
	core, logs := observer.New(zap.InfoLevel)
	p, err := NewPool(PoolConfig{Name: "pool", Namespace: ns, Rules: store, CRDRecheck: 100 * time.Millisecond}, kube, dyn, zap.New(core))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, func([]endpoint.Endpoint) {}) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	require.Eventually(t, func() bool {
		return logs.FilterMessage("model rule CRD not installed; looking again later").Len() == 2
	}, 10*time.Second, 10*time.Millisecond, "both kinds looked for")

	installCRDs()
	require.Eventually(t, func() bool { return logs.FilterMessage("watching model rules").Len() == 2 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, 2, logs.FilterMessage("model rule CRD not installed; looking again later").Len(), "logged once per kind")

	require.Equal(t, 2, logs.FilterMessage("watching model rules").FilterField(zap.String("resource", objectiveGVRs[group].String())).Len()+
		logs.FilterMessage("watching model rules").FilterField(zap.String("resource", rewriteGVRs[group].String())).Len())
	objectives := dyn.Resource(objectiveGVRs[group]).Namespace(ns)
	rewrites := dyn.Resource(rewriteGVRs[group]).Namespace(ns)
	obj := func(kind, name string, spec map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": objectiveGVRs[group].GroupVersion().String(), "kind": kind,
			"metadata": map[string]any{"name": name, "namespace": ns}, "spec": spec}}
	}
	ref := map[string]any{"name": "pool"}
	rule := func(match string, targets ...map[string]any) map[string]any {
		ts := make([]any, len(targets))
		for i, tg := range targets {
			ts[i] = tg
		}
		return map[string]any{"matches": []any{map[string]any{"model": map[string]any{"value": match}}}, "targets": ts}
	}
	target := func(model string, weight int64) map[string]any {
		tg := map[string]any{"modelRewrite": model}
		if weight > 0 {
			tg["weight"] = weight
		}
		return tg
	}
	band := func(o string) string { b, _ := store.Load().Band(o); return b }
	rewrite := func(m string) string { tg, _, _ := store.Load().Rewrite(m); return tg }
	within := func(what string, cond func() bool) {
		t.Helper()
		require.Eventually(t, cond, changeWithin, 5*time.Millisecond, what)
	}

	_, err = objectives.Create(ctx, obj("InferenceObjective", "premium", map[string]any{"priority": int64(10), "poolRef": ref}), metav1.CreateOptions{})
	require.NoError(t, err)
	within("objective created", func() bool { return band("premium") == "high" })

	_, err = objectives.Create(ctx, obj("InferenceObjective", "elsewhere", map[string]any{"priority": int64(10), "poolRef": map[string]any{"name": "other"}}), metav1.CreateOptions{})
	require.NoError(t, err)
	cv, err := rewrites.Create(ctx, obj("InferenceModelRewrite", "canary", map[string]any{"poolRef": ref,
		"rules": []any{rule("m", target("m-v2", 0))}}), metav1.CreateOptions{})
	require.NoError(t, err)
	within("rewrite created", func() bool { return rewrite("m") == "m-v2" })
	require.Empty(t, band("elsewhere"), "another pool's objective")

	// The CRD's schema refuses what it can express; the EPP checks the rest.
	_, err = rewrites.Create(ctx, obj("InferenceModelRewrite", "zero", map[string]any{"poolRef": ref,
		"rules": []any{rule("z", target("x", 0), map[string]any{"modelRewrite": "y", "weight": int64(0)})}}), metav1.CreateOptions{})
	require.ErrorContains(t, err, "should be greater than or equal to 1")

	// Mixed weights pass the schema; the EPP keeps the last good version.
	cv.Object["spec"] = map[string]any{"poolRef": ref, "rules": []any{rule("m", target("a", 3), target("b", 0))}}
	_, err = rewrites.Update(ctx, cv, metav1.UpdateOptions{})
	require.NoError(t, err)
	within("invalid version logged", func() bool {
		return logs.FilterMessage("invalid inferencemodelrewrite ignored, its last good version stays").Len() == 1
	})
	require.Equal(t, "m-v2", rewrite("m"))

	po, err := objectives.Get(ctx, "premium", metav1.GetOptions{})
	require.NoError(t, err)
	po.Object["spec"] = map[string]any{"priority": int64(-5), "poolRef": ref}
	po, err = objectives.Update(ctx, po, metav1.UpdateOptions{})
	require.NoError(t, err)
	within("objective changed", func() bool { return band("premium") == "low" })
	require.Equal(t, 1, logs.FilterMessage("invalid inferencemodelrewrite ignored, its last good version stays").Len(), "logged once")

	po.Object["spec"] = map[string]any{"priority": int64(-5), "poolRef": map[string]any{"name": "other"}}
	_, err = objectives.Update(ctx, po, metav1.UpdateOptions{})
	require.NoError(t, err)
	within("objective moved to another pool", func() bool { return band("premium") == "" })
	require.NoError(t, rewrites.Delete(ctx, "canary", metav1.DeleteOptions{}))
	within("rewrite deleted", func() bool { return rewrite("m") == "" })
}
