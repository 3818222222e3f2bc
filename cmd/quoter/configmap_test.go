package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/omnious/provider-node/internal/testutil/kubetest"
)

// The control plane starts only for the tests that ask for it.
func TestMain(m *testing.M) { kubetest.Main(m) }

func getConfigMap(t *testing.T, env *kubetest.Env, ns, name string) *corev1.ConfigMap {
	t.Helper()
	cm, err := env.Kube.CoreV1().ConfigMaps(ns).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return cm
}

// TestSaveCalibrationConfigMapCreatesThenUpdates: the first save creates
// the ConfigMap with its labels and the one key; the second replaces the
// data and keeps what an operator added.
func TestSaveCalibrationConfigMapCreatesThenUpdates(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.FreshNamespace(t, "calibration-admin")
	t.Setenv("KUBECONFIG", env.Kubeconfig(t, env.Config))
	ctx := context.Background()

	require.NoError(t, saveCalibrationConfigMap(ctx, ns, "cal", []byte(`{"v":1}`)))
	cm := getConfigMap(t, env, ns, "cal")
	require.Equal(t, map[string]string{calibrationKey: `{"v":1}`}, cm.Data)
	require.Equal(t, calibrationLabels, cm.Labels)

	cm.Labels["team"] = "supply"
	cm.Data["stale"] = "x"
	_, err := env.Kube.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{})
	require.NoError(t, err)

	require.NoError(t, saveCalibrationConfigMap(ctx, ns, "cal", []byte(`{"v":2}`)))
	cm = getConfigMap(t, env, ns, "cal")
	require.Equal(t, map[string]string{calibrationKey: `{"v":2}`}, cm.Data)
	require.Equal(t, "supply", cm.Labels["team"])
	require.Equal(t, "omnious-quoter", cm.Labels["app.kubernetes.io/managed-by"])
}

func TestSaveCalibrationConfigMapErrors(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.FreshNamespace(t, "calibration-errors")
	ctx := context.Background()

	t.Setenv("KUBECONFIG", env.Kubeconfig(t, env.UserConfig("nobody")))
	err := saveCalibrationConfigMap(ctx, ns, "cal", []byte(`{}`))
	require.ErrorContains(t, err, "get ConfigMap "+ns+"/cal")
	require.ErrorContains(t, err, "forbidden")

	require.ErrorContains(t, saveCalibrationConfigMap(ctx, ns, "cal", []byte{0xff}), "not UTF-8")
	require.ErrorContains(t, saveCalibrationConfigMap(ctx, ns, "", []byte(`{}`)), "no name")

	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	require.ErrorContains(t, saveCalibrationConfigMap(ctx, ns, "cal", []byte(`{}`)), "not in a cluster and KUBECONFIG is not set")
}

// helm finds helm on PATH or in the Go bin directory, where deploy/tools.sh
// installs it.
func helm(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	out, err := exec.Command("go", "env", "GOPATH").Output()
	require.NoError(t, err)
	p := filepath.Join(strings.TrimSpace(string(out)), "bin", "helm")
	_, err = os.Stat(p)
	require.NoError(t, err, "helm not found: run deploy/tools.sh (make deps)")
	return p
}

// calibrationAccess renders the chart for namespace ns as deploy/check.sh
// does and returns the calibration Job's ServiceAccount name, the
// ServiceAccount, Role and RoleBinding the chart gives it, and the
// ConfigMap name the Job writes.
func calibrationAccess(t *testing.T, ns string) (sa string, objs []*unstructured.Unstructured, configMap string) {
	t.Helper()
	cmd := exec.Command(helm(t), "template", "pn", "provider-node", "--kube-version", "1.33.0", "--namespace", ns, "-f", "ci/base.yaml")
	cmd.Dir = "../../deploy/helm"
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "helm template: %s", stderr.String())
	all, err := kubetest.Decode(out)
	require.NoError(t, err)

	var job *unstructured.Unstructured
	for _, o := range all {
		if o.GetKind() == "Job" && o.GetLabels()["app.kubernetes.io/component"] == "calibration" {
			job = o
		}
	}
	require.NotNil(t, job, "the chart renders no calibration Job")
	sa, _, _ = unstructured.NestedString(job.Object, "spec", "template", "spec", "serviceAccountName")
	require.NotEmpty(t, sa, "the calibration Job names no ServiceAccount")
	containers, _, _ := unstructured.NestedSlice(job.Object, "spec", "template", "spec", "containers")
	require.Len(t, containers, 1)
	args, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--configmap="); ok {
			configMap = v
		}
	}
	require.NotEmpty(t, configMap, "the calibration Job passes no --configmap: %v", args)

	for _, o := range all {
		switch o.GetKind() {
		case "ServiceAccount":
			if o.GetName() == sa {
				objs = append(objs, o)
			}
		case "RoleBinding", "ClusterRoleBinding":
			subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
			if !slices.ContainsFunc(subjects, func(s any) bool {
				m, _ := s.(map[string]any)
				return m["kind"] == "ServiceAccount" && m["name"] == sa
			}) {
				continue
			}
			require.Equal(t, "RoleBinding", o.GetKind(), "the calibration Job gets a cluster-wide binding")
			role, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
			i := slices.IndexFunc(all, func(r *unstructured.Unstructured) bool { return r.GetKind() == "Role" && r.GetName() == role })
			require.GreaterOrEqual(t, i, 0, "binding %s refers to Role %s, which the chart does not render", o.GetName(), role)
			objs = append(objs, all[i], o)
		}
	}
	require.Len(t, objs, 3, "want the calibration ServiceAccount, one Role and its RoleBinding")
	return sa, objs, configMap
}

// withoutVerb returns copies of objs whose Roles lack verb in every rule
// (a rule left with no verb goes: the API server refuses it).
func withoutVerb(objs []*unstructured.Unstructured, verb string) []*unstructured.Unstructured {
	out := make([]*unstructured.Unstructured, len(objs))
	for i, o := range objs {
		out[i] = o.DeepCopy()
		if o.GetKind() != "Role" {
			continue
		}
		rules, _, _ := unstructured.NestedSlice(out[i].Object, "rules")
		var kept []any
		for _, r := range rules {
			m := r.(map[string]any)
			verbs, _, _ := unstructured.NestedStringSlice(m, "verbs")
			var vs []any
			for _, v := range verbs {
				if v != verb {
					vs = append(vs, v)
				}
			}
			if len(vs) > 0 {
				m["verbs"] = vs
				kept = append(kept, m)
			}
		}
		_ = unstructured.SetNestedSlice(out[i].Object, kept, "rules")
	}
	return out
}

// allowed asks the API server whether ServiceAccount ns/sa may do verb on
// the ConfigMap name ("" = any) in ns.
func allowed(t *testing.T, env *kubetest.Env, ns, sa, verb, name string) bool {
	t.Helper()
	r, err := env.Kube.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:" + ns + ":" + sa,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Resource: "configmaps", Name: name},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	return r.Status.Allowed
}

// TestSaveCalibrationConfigMapWithTheChartsRole runs the save as the
// calibration Job's ServiceAccount, bound to exactly what the chart
// renders: it creates and then updates the ConfigMap, may touch no other
// ConfigMap, and fails, naming the verb, without create, get or update.
func TestSaveCalibrationConfigMapWithTheChartsRole(t *testing.T) {
	env := kubetest.Shared(t)
	ctx := context.Background()
	// prepare stores the chart's calibration identity, its Role edited,
	// in a fresh namespace and waits until the authorizer answers for
	// each verb as the Role says.
	prepare := func(t *testing.T, drop string) (ns, configMap string) {
		ns = env.FreshNamespace(t, "calibration-rbac")
		sa, objs, configMap := calibrationAccess(t, ns)
		if drop != "" {
			objs = withoutVerb(objs, drop)
		}
		var buf bytes.Buffer
		for _, o := range objs {
			data, err := json.Marshal(o.Object)
			require.NoError(t, err)
			buf.Write(data)
		}
		_, err := env.Apply(ctx, buf.Bytes(), kubetest.ApplyOptions{Namespace: ns})
		require.NoError(t, err)
		for _, verb := range []string{"create", "get", "update"} {
			name := configMap
			if verb == "create" {
				name = ""
			}
			require.Eventually(t, func() bool { return allowed(t, env, ns, sa, verb, name) == (verb != drop) },
				10*time.Second, 20*time.Millisecond, "RBAC for %s never settled", verb)
		}
		t.Setenv("KUBECONFIG", env.Kubeconfig(t, env.ServiceAccountConfig(t, ns, sa)))
		return ns, configMap
	}

	t.Run("the chart's Role: create, then update", func(t *testing.T) {
		ns, name := prepare(t, "")
		require.NoError(t, saveCalibrationConfigMap(ctx, ns, name, []byte(`{"v":1}`)))
		require.Equal(t, `{"v":1}`, getConfigMap(t, env, ns, name).Data[calibrationKey])
		require.NoError(t, saveCalibrationConfigMap(ctx, ns, name, []byte(`{"v":2}`)))
		cm := getConfigMap(t, env, ns, name)
		require.Equal(t, map[string]string{calibrationKey: `{"v":2}`}, cm.Data)
		require.Equal(t, calibrationLabels, cm.Labels)

		// Any other ConfigMap of the namespace: it may create one, never
		// read or change one.
		_, err := env.Kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "other"}}, metav1.CreateOptions{})
		require.NoError(t, err)
		err = saveCalibrationConfigMap(ctx, ns, "other", []byte(`{}`))
		require.ErrorContains(t, err, "get ConfigMap "+ns+"/other")
		require.ErrorContains(t, err, "forbidden")
	})
	for _, verb := range []string{"create", "get", "update"} {
		t.Run("without "+verb, func(t *testing.T) {
			ns, name := prepare(t, verb)
			err := saveCalibrationConfigMap(ctx, ns, name, []byte(`{"v":1}`))
			if err == nil {
				// The first save created it; the second must update it.
				err = saveCalibrationConfigMap(ctx, ns, name, []byte(`{"v":2}`))
			}
			require.Error(t, err, "the save succeeded without %s: the chart's Role grants more than it needs", verb)
			require.ErrorContains(t, err, verb+" ConfigMap "+ns+"/"+name)
			require.ErrorContains(t, err, `cannot `+verb+` resource "configmaps"`)
		})
	}
}
