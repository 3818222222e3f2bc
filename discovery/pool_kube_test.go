package discovery

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/zapr"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/internal/rbac"
	"github.com/omnious/provider-node/internal/testutil/kubetest"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

var poolCRD = filepath.Join("..", "deploy", "crds", "inference.networking.k8s.io_inferencepools.yaml")

// kubeEnv is the package's control plane with the InferencePool CRD.
func kubeEnv(t testing.TB) *kubetest.Env {
	t.Helper()
	env := kubetest.Shared(t)
	env.InstallCRDs(t, poolCRD)
	return env
}

var nsSeq atomic.Int64

// testNamespace is a namespace of the test's own (namespaces are never
// deleted on a control plane without a controller manager).
func testNamespace(t testing.TB, env *kubetest.Env) string {
	name := strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "-"))
	name = fmt.Sprintf("%.40s-%d", strings.Trim(name, "-"), nsSeq.Add(1))
	return env.Namespace(t, name)
}

// cluster drives the API server as an administrator: it creates the pool
// and Pods and patches Pod status the way the kubelet would.
type cluster struct {
	t   testing.TB
	env *kubetest.Env
	ns  string
	ctx context.Context
}

func newCluster(t testing.TB) *cluster { return clusterOn(t, kubeEnv(t)) }

// clusterOn is a cluster on a control plane with the InferencePool CRD.
func clusterOn(t testing.TB, env *kubetest.Env) *cluster {
	return &cluster{t: t, env: env, ns: testNamespace(t, env), ctx: context.Background()}
}

// grant binds ServiceAccount sa a Role of exactly needs in the namespace.
func (c *cluster) grant(sa string, needs []rbac.Need) {
	c.t.Helper()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: sa}}
	for _, n := range needs {
		role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: []string{n.Group}, Resources: []string{n.Resource}, Verbs: []string{n.Verb}})
	}
	_, err := c.env.Kube.RbacV1().Roles(c.ns).Create(c.ctx, role, metav1.CreateOptions{})
	require.NoError(c.t, err)
	_, err = c.env.Kube.RbacV1().RoleBindings(c.ns).Create(c.ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: sa},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: sa},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: c.ns}},
	}, metav1.CreateOptions{})
	require.NoError(c.t, err)
}

func (c *cluster) pools() dynamic.ResourceInterface {
	return c.env.Dynamic.Resource(poolGVR).Namespace(c.ns)
}

func poolObject(selector map[string]string, ports ...int) *unstructured.Unstructured {
	ml := map[string]any{}
	for k, v := range selector {
		ml[k] = v
	}
	tp := make([]any, len(ports))
	for i, p := range ports {
		tp[i] = map[string]any{"number": int64(p)}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1",
		"kind":       "InferencePool",
		"metadata":   map[string]any{"name": "pool"},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": ml},
			"targetPorts":       tp,
			"endpointPickerRef": map[string]any{"name": "epp", "port": map[string]any{"number": int64(9002)}},
		},
	}}
}

// setPool creates the pool or replaces its spec.
func (c *cluster) setPool(selector map[string]string, ports ...int) {
	c.t.Helper()
	obj := poolObject(selector, ports...)
	cur, err := c.pools().Get(c.ctx, "pool", metav1.GetOptions{})
	if err == nil {
		cur.Object["spec"] = obj.Object["spec"]
		_, err = c.pools().Update(c.ctx, cur, metav1.UpdateOptions{})
	} else {
		_, err = c.pools().Create(c.ctx, obj, metav1.CreateOptions{})
	}
	require.NoError(c.t, err)
}

func (c *cluster) deletePool() {
	c.t.Helper()
	require.NoError(c.t, c.pools().Delete(c.ctx, "pool", metav1.DeleteOptions{}))
}

func (c *cluster) pods() podClient { return c.env.Kube.CoreV1().Pods(c.ns) }

type podClient = interface {
	Create(context.Context, *corev1.Pod, metav1.CreateOptions) (*corev1.Pod, error)
	Patch(context.Context, string, types.PatchType, []byte, metav1.PatchOptions, ...string) (*corev1.Pod, error)
	Delete(context.Context, string, metav1.DeleteOptions) error
}

// createPod creates a Pod with labels and annotations (key, value pairs
// separated by "="), not yet running. node binds it to a node, so that
// deleting it leaves it terminating (no kubelet confirms the deletion).
func (c *cluster) createPod(name, node string, labels map[string]string, annotations ...string) {
	c.t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: map[string]string{}},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "engine", Image: "engine:test"}},
		},
	}
	for _, kv := range annotations {
		k, v, _ := strings.Cut(kv, "=")
		pod.Annotations[k] = v
	}
	_, err := c.pods().Create(c.ctx, pod, metav1.CreateOptions{})
	require.NoError(c.t, err)
}

// setStatus reports a Pod's IP and readiness as its kubelet would.
func (c *cluster) setStatus(name, ip string, ready bool) {
	c.t.Helper()
	c.env.SetPodStatus(c.t, c.ns, name, ip, ready)
}

// pod creates a Pod and reports it at ip, ready or not.
func (c *cluster) pod(name, ip string, ready bool, labels map[string]string, annotations ...string) {
	c.t.Helper()
	c.createPod(name, "", labels, annotations...)
	c.setStatus(name, ip, ready)
}

func (c *cluster) relabel(name string, labels map[string]string) {
	c.t.Helper()
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	require.NoError(c.t, err)
	_, err = c.pods().Patch(c.ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	require.NoError(c.t, err)
}

func (c *cluster) deletePod(name string) {
	c.t.Helper()
	require.NoError(c.t, c.pods().Delete(c.ctx, name, metav1.DeleteOptions{}))
}

// watcher is a Pool source running as a ServiceAccount of the test's
// namespace, with its updates and logs.
type watcher struct {
	u    *updates
	logs *observer.ObservedLogs
	errc chan error
}

type watchOpts struct {
	cfg PoolConfig
	// needs granted to the watcher's ServiceAccount; nil: poolAccess.
	needs []rbac.Need
	// via rewrites the watcher's REST config (a proxy).
	via             func(*rest.Config) *rest.Config
	skipAccessCheck bool
}

func (c *cluster) watch(o watchOpts) *watcher {
	c.t.Helper()
	sa := fmt.Sprintf("epp-%d", nsSeq.Add(1))
	if o.needs == nil {
		o.needs = poolAccess
	}
	c.grant(sa, o.needs)
	rc := c.env.ServiceAccountConfig(c.t, c.ns, sa)
	if o.via != nil {
		rc = o.via(rc)
	}
	core, logs := observer.New(zap.DebugLevel)
	o.cfg.Name, o.cfg.Namespace = "pool", c.ns
	src, err := NewPoolForConfig(o.cfg, rc, zap.New(core))
	require.NoError(c.t, err)
	src.skipAccessCheck = o.skipAccessCheck
	w := &watcher{u: newUpdates(), logs: logs, errc: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { w.errc <- src.Run(ctx, w.u.update) }()
	c.t.Cleanup(func() {
		cancel()
		select {
		case err := <-w.errc:
			require.NoError(c.t, err)
		case <-time.After(30 * time.Second): // a hang, not a slow shutdown on a loaded host
			c.t.Errorf("Pool.Run did not return after cancel; its goroutines:\n%s", stacksOf("discovery.", "client-go/tools/cache."))
		}
		requireDistinct(c.t, w.u.all())
		if c.t.Failed() {
			for _, e := range logs.All() {
				c.t.Logf("pool log: %s %s %v", e.Level, e.Message, e.ContextMap())
			}
		}
	})
	return w
}

func (w *watcher) waitAddrs(t testing.TB, what string, want ...string) []endpoint.Endpoint {
	t.Helper()
	return w.waitAddrsWithin(t, 10*time.Second, what, want...)
}

func (w *watcher) waitAddrsWithin(t testing.TB, timeout time.Duration, what string, want ...string) []endpoint.Endpoint {
	t.Helper()
	if want == nil {
		want = []string{}
	}
	return w.u.waitWithin(t, timeout, what, func(eps []endpoint.Endpoint) bool { return slices.Equal(addrs(eps), want) })
}

func app(v string) map[string]string { return map[string]string{"app": v, "omnious.io/model": "m"} }

// TestPoolLifecycle drives one pool through every kind of change a real
// API server delivers, each checked in the endpoint set.
func TestPoolLifecycle(t *testing.T) {
	c := newCluster(t)
	c.setPool(map[string]string{"app": "a"}, 8000)
	c.pod("p1", "127.0.0.1", true, app("a"))
	c.pod("p2", "127.0.0.2", false, app("a"))
	c.pod("p3", "127.0.0.3", true, app("b"), "omnious.io/kv-events-port=5557")
	// Same labels in another namespace: never part of the pool.
	other := &cluster{t: t, env: c.env, ns: testNamespace(t, c.env), ctx: c.ctx}
	other.pod("elsewhere", "127.0.0.9", true, app("a"))

	w := c.watch(watchOpts{})
	w.waitAddrs(t, "initial ready pod", "127.0.0.1:8000")

	c.setStatus("p2", "127.0.0.2", true)
	w.waitAddrs(t, "p2 ready", "127.0.0.1:8000", "127.0.0.2:8000")

	c.setStatus("p1", "127.0.0.1", false)
	w.waitAddrs(t, "p1 not ready", "127.0.0.2:8000")

	c.createPod("p4", "node-a", app("a"))
	w.waitAddrs(t, "p4 created, no IP yet", "127.0.0.2:8000")
	c.setStatus("p4", "127.0.0.5", true)
	w.waitAddrs(t, "p4 ready", "127.0.0.2:8000", "127.0.0.5:8000")

	// A Pod bound to a node is terminating until its kubelet confirms.
	c.deletePod("p4")
	w.waitAddrs(t, "p4 terminating", "127.0.0.2:8000")

	c.relabel("p2", map[string]string{"app": "c"})
	w.waitAddrs(t, "p2 relabelled out", []string{}...)
	c.relabel("p2", map[string]string{"app": "a"})
	w.waitAddrs(t, "p2 relabelled back", "127.0.0.2:8000")

	// Several target ports (data-parallel ranks): one endpoint per port.
	c.setPool(map[string]string{"app": "a"}, 8000, 8001)
	w.waitAddrs(t, "two ports", "127.0.0.2:8000", "127.0.0.2:8001")

	// Selector change: the Pod watch is re-created with the new selector.
	c.setPool(map[string]string{"app": "b"}, 8000, 8001)
	got := w.waitAddrs(t, "selector app=b", "127.0.0.3:8000", "127.0.0.3:8001")
	require.Equal(t, "tcp://127.0.0.3:5557", got[0].KVEvents)
	require.Equal(t, "tcp://127.0.0.3:5558", got[1].KVEvents)
	require.Equal(t, "http://127.0.0.3:8001/metrics", got[1].MetricsURL)

	c.pod("p5", "127.0.0.6", true, app("b"))
	w.waitAddrs(t, "p5 added", "127.0.0.3:8000", "127.0.0.3:8001", "127.0.0.6:8000", "127.0.0.6:8001")
	c.deletePod("p3")
	w.waitAddrs(t, "p3 deleted", "127.0.0.6:8000", "127.0.0.6:8001")

	c.deletePool()
	w.waitAddrs(t, "pool deleted", []string{}...)
	c.setPool(map[string]string{"app": "a"}, 9000)
	w.waitAddrs(t, "pool re-created", "127.0.0.2:9000")
}

// TestPoolRejectedSpecs: the CRD's schema refuses the specs parsePoolSpec
// guards against, so the last valid spec is what the API server keeps.
func TestPoolRejectedSpecs(t *testing.T) {
	c := newCluster(t)
	c.setPool(map[string]string{"app": "a"}, 8000)
	for name, ports := range map[string][]int{"port 0": {0}, "port 70000": {70000}, "no ports": {}} {
		obj := poolObject(map[string]string{"app": "a"}, ports...)
		obj.SetName("bad")
		_, err := c.pools().Create(c.ctx, obj, metav1.CreateOptions{})
		require.Error(t, err, name)
		require.Contains(t, err.Error(), "spec.targetPorts", name)
	}
}

func TestPoolMissingAtStart(t *testing.T) {
	c := newCluster(t)
	c.pod("p1", "127.0.0.1", true, map[string]string{"app": "a"})
	w := c.watch(watchOpts{cfg: PoolConfig{DefaultModel: "m"}})
	w.waitAddrs(t, "no pool yet", []string{}...)

	c.setPool(map[string]string{"app": "a"}, 8000)
	eps := w.waitAddrs(t, "pool created", "127.0.0.1:8000")
	require.Equal(t, "m", eps[0].Model)
	require.Equal(t, "vllm", eps[0].Engine)
}

func TestPoolOtherPoolIgnored(t *testing.T) {
	c := newCluster(t)
	obj := poolObject(map[string]string{"app": "a"}, 8000)
	obj.SetName("not-ours")
	_, err := c.pools().Create(c.ctx, obj, metav1.CreateOptions{})
	require.NoError(t, err)
	c.pod("p1", "127.0.0.1", true, app("a"))
	w := c.watch(watchOpts{})
	w.waitAddrs(t, "other pool is not ours", []string{}...)
	require.Len(t, w.u.all(), 1)
}

// captureKlog sends client-go's own log (its reflectors log through klog)
// to an observer, down to verbosity 4, until the test ends.
func captureKlog(t testing.TB) *observer.ObservedLogs {
	core, logs := observer.New(zapcore.Level(-4))
	klog.SetLogger(zapr.NewLogger(zap.New(core)))
	fs := flag.NewFlagSet("klog", flag.PanicOnError)
	klog.InitFlags(fs)
	require.NoError(t, fs.Set("v", "4"))
	t.Cleanup(func() {
		_ = fs.Set("v", "0")
		klog.ClearLogger()
	})
	return logs
}

func logged(logs *observer.ObservedLogs, text string) bool {
	return slices.ContainsFunc(logs.All(), func(e observer.LoggedEntry) bool {
		return strings.Contains(e.Message+fmt.Sprint(e.ContextMap()), text)
	})
}

// TestPoolWatchResumesAndExpires: the EPP loses the API server twice while
// Pods change. The first time its watches resume from their
// resourceVersion and replay what they missed from the API server's watch
// cache. The second time the API server restarts meanwhile (a rolling
// control-plane upgrade): its new watch cache starts at the current etcd
// revision, past compacted history, so the resumed watches get 410 Gone
// ("too old resource version"), the informers list again, and the set is
// the truth: a Pod deleted, one added and one readied during the outage.
func TestPoolWatchResumesAndExpires(t *testing.T) {
	c := newCluster(t)
	c.setPool(map[string]string{"app": "a"}, 8000)
	c.pod("p1", "127.0.0.1", true, app("a"))
	c.pod("p2", "127.0.0.2", false, app("a"))
	c.pod("p3", "127.0.0.3", false, app("a"))
	proxy := c.env.Proxy(t)
	klogs := captureKlog(t)
	t.Cleanup(func() {
		if t.Failed() {
			for _, e := range klogs.All() {
				t.Logf("client-go: %s %v", e.Message, e.ContextMap())
			}
		}
	})
	w := c.watch(watchOpts{via: proxy.Config})
	w.waitAddrs(t, "before the outages", "127.0.0.1:8000")
	// An event on the open watch: a watch that ends having delivered
	// nothing is relisted by client-go, not resumed.
	c.setStatus("p2", "127.0.0.2", true)
	w.waitAddrs(t, "p2 ready", "127.0.0.1:8000", "127.0.0.2:8000")

	proxy.Cut()
	c.deletePod("p1")
	c.setStatus("p3", "127.0.0.3", true)
	require.NoError(t, proxy.Restore())
	w.waitAddrs(t, "after the first outage", "127.0.0.2:8000", "127.0.0.3:8000")
	require.False(t, logged(klogs, "too old resource version"), "a short outage expired the watch")

	proxy.Cut()
	c.deletePod("p2")
	c.pod("p4", "127.0.0.4", true, app("a"))
	c.pod("p5", "127.0.0.5", true, app("a"))
	_, err := c.env.Compact(c.ctx)
	require.NoError(t, err)
	restart := time.Now()
	c.env.RestartAPIServer(t)
	t.Logf("API server restarted in %s", time.Since(restart).Round(time.Millisecond))
	require.NoError(t, proxy.Restore())
	// client-go retries a refused watch with a backoff that doubles up to
	// 30 s: the set stays as last known until the retry after Restore.
	start := time.Now()
	w.waitAddrsWithin(t, 45*time.Second, "after the restart", "127.0.0.3:8000", "127.0.0.4:8000", "127.0.0.5:8000")
	t.Logf("set correct %s after the API server was back", time.Since(start).Round(time.Millisecond))
	require.True(t, logged(klogs, "too old resource version"), "no watch ended with 410 Gone")

	// The watches opened after the relist deliver changes again.
	c.setStatus("p3", "127.0.0.3", false)
	w.waitAddrs(t, "after resuming", "127.0.0.4:8000", "127.0.0.5:8000")
}

// TestPoolAccessChecked: a ServiceAccount missing any one permission the
// Pool needs is refused at start with an error naming it.
func TestPoolAccessChecked(t *testing.T) {
	c := newCluster(t)
	for i, missing := range poolAccess {
		t.Run(missing.String(), func(t *testing.T) {
			needs := slices.Delete(slices.Clone(poolAccess), i, i+1)
			c := &cluster{t: t, env: c.env, ns: c.ns, ctx: c.ctx}
			w := c.watch(watchOpts{needs: needs})
			select {
			case err := <-w.errc:
				var denied *rbac.DeniedError
				require.ErrorAs(t, err, &denied)
				require.Equal(t, []rbac.Need{missing}, denied.Denied)
				require.ErrorContains(t, err, "cannot "+missing.String()+" in namespace")
				w.errc <- nil // for the cleanup
			case <-time.After(30 * time.Second):
				t.Fatal("Pool.Run did not refuse to start")
			}
		})
	}
}

// TestPoolAccessNeeded: each permission the check asks for is one the
// informers use. Without the check, each missing grant shows in the API
// server's own refusal. The API server runs without WatchList (the default
// of Kubernetes 1.33, which the chart supports): with it, informers stream
// their initial state over a watch and list only when that fails.
func TestPoolAccessNeeded(t *testing.T) {
	env := kubetest.Start(t, kubetest.Options{APIServerArgs: []string{"--feature-gates=WatchList=false"}})
	env.InstallCRDs(t, poolCRD)
	c := clusterOn(t, env)
	c.setPool(map[string]string{"app": "a"}, 8000)
	for i, missing := range poolAccess {
		t.Run(missing.String(), func(t *testing.T) {
			needs := slices.Delete(slices.Clone(poolAccess), i, i+1)
			c := &cluster{t: t, env: c.env, ns: c.ns, ctx: c.ctx}
			w := c.watch(watchOpts{needs: needs, skipAccessCheck: true})
			refusal := fmt.Sprintf("cannot %s resource %q in API group %q", missing.Verb, missing.Resource, missing.Group)
			require.Eventually(t, func() bool {
				return slices.ContainsFunc(w.logs.All(), func(e observer.LoggedEntry) bool {
					err, _ := e.ContextMap()["error"].(string)
					return strings.Contains(err, refusal)
				})
			}, 30*time.Second, 50*time.Millisecond, "no refusal %q", refusal)
		})
	}
}

// stacksOf is every goroutine's stack that has a frame naming one of
// parts: what a test that waits in vain for them to end reports.
func stacksOf(parts ...string) string {
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	var out []string
	for _, g := range strings.Split(b.String(), "\n\n") {
		for _, part := range parts {
			if strings.Contains(g, part) {
				out = append(out, g)
				break
			}
		}
	}
	return strings.Join(out, "\n\n")
}
