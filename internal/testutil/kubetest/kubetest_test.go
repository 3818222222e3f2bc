package kubetest_test

import (
	"context"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/omnious/provider-node/internal/testutil/kubetest"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

func TestAuthenticationAndRBAC(t *testing.T) {
	env := kubetest.Shared(t)
	ctx := context.Background()
	ns := env.Namespace(t, "kubetest-auth")

	// The administrator may do anything.
	_, err := env.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	require.NoError(t, err)

	// No credentials: 401, not a permissive default.
	anon := &rest.Config{Host: env.Host, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}}
	hc, err := rest.HTTPClientFor(anon)
	require.NoError(t, err)
	resp, err := hc.Get(env.Host + "/api/v1/namespaces")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	// A certificate user and a ServiceAccount token are authenticated but
	// may do nothing until a role is bound.
	user := kubernetes.NewForConfigOrDie(env.UserConfig("alice"))
	_, err = user.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	require.True(t, apierrors.IsForbidden(err), "%v", err)
	require.ErrorContains(t, err, `User "alice" cannot list resource "pods"`)

	sa := kubernetes.NewForConfigOrDie(env.ServiceAccountConfig(t, ns, "reader"))
	_, err = sa.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	require.ErrorContains(t, err, `User "system:serviceaccount:kubetest-auth:reader" cannot list resource "pods"`)

	_, err = env.Kube.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "read-pods"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = env.Kube.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "read-pods"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "read-pods"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "reader", Namespace: ns}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err = sa.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "bound role not honoured: %v", err)
	_, err = sa.CoreV1().Pods(ns).Get(ctx, "x", metav1.GetOptions{})
	require.ErrorContains(t, err, `cannot get resource "pods"`)
}

func TestKubeconfigAndKubectl(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t, "kubetest-kubectl")
	kubectl, err := kubetest.Kubectl()
	require.NoError(t, err)
	cfg := env.Kubeconfig(t, env.ServiceAccountConfig(t, ns, "nobody"))
	out, err := exec.Command(kubectl, "--kubeconfig", cfg, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, "system:serviceaccount:kubetest-kubectl:nobody", string(out))

	out, err = exec.Command(kubectl, "--kubeconfig", env.Kubeconfig(t, env.Config), "version", "-o", "json").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), `"gitVersion": "v1.37.2"`)
}

func TestInstallCRDsAndApply(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t, "kubetest-apply")
	env.InstallCRDs(t, filepath.Join("..", "..", "..", "deploy", "crds", "inference.networking.k8s.io_inferencepools.yaml"))
	ctx := context.Background()
	pool := []byte(`
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: p}
spec:
  selector: {matchLabels: {app: x}}
  targetPorts: [{number: 8000}]
  endpointPickerRef: {name: epp, port: {number: 9002}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: c}
data: {k: v}
`)
	// Dry run: admitted, not stored.
	objs, err := env.Apply(ctx, pool, kubetest.ApplyOptions{Namespace: ns, DryRun: true})
	require.NoError(t, err)
	require.Len(t, objs, 2)
	_, err = env.Kube.CoreV1().ConfigMaps(ns).Get(ctx, "c", metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err), "%v", err)

	_, err = env.Apply(ctx, pool, kubetest.ApplyOptions{Namespace: ns})
	require.NoError(t, err)
	gvr := schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}
	got, err := env.Dynamic.Resource(gvr).Namespace(ns).Get(ctx, "p", metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, "p", got.GetName())

	// The CRD's schema is enforced: the API server refuses what a fake accepts.
	_, err = env.Apply(ctx, []byte(strings.Replace(string(pool), "number: 8000", "number: 0", 1)), kubetest.ApplyOptions{Namespace: ns, DryRun: true})
	require.ErrorContains(t, err, "InferencePool")
	require.ErrorContains(t, err, "spec.targetPorts[0].number")
}

func TestCompactAndProxy(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t, "kubetest-compact")
	ctx := context.Background()
	cm, err := env.Kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = env.Kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "d"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	rev, err := env.Compact(ctx)
	require.NoError(t, err)
	require.Greater(t, rev, int64(0))
	// etcd refuses a read below the compacted revision.
	resp, err := http.Post(env.EtcdURL+"/v3/kv/range", "application/json",
		strings.NewReader(`{"key":"AA==","revision":"`+cm.ResourceVersion+`"}`))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Contains(t, string(body), "required revision has been compacted")

	p := env.Proxy(t)
	via := kubernetes.NewForConfigOrDie(p.Config(env.Config))
	_, err = via.CoreV1().ConfigMaps(ns).Get(ctx, "c", metav1.GetOptions{})
	require.NoError(t, err)
	p.Cut()
	_, err = via.CoreV1().ConfigMaps(ns).Get(ctx, "c", metav1.GetOptions{})
	require.Error(t, err)
	require.NoError(t, p.Restore())
	_, err = via.CoreV1().ConfigMaps(ns).Get(ctx, "c", metav1.GetOptions{})
	require.NoError(t, err)
}

func TestMissingBinariesFail(t *testing.T) {
	t.Setenv("KUBETEST_BINDIR", t.TempDir())
	_, err := kubetest.New(kubetest.Options{})
	require.ErrorContains(t, err, "run scripts/controlplane.sh")
}
