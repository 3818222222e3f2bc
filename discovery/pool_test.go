package discovery

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/omnious/provider-node/endpoint"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const testNS = "serving"

func testPool(matchLabels map[string]any, ports ...int64) *unstructured.Unstructured {
	tp := make([]any, len(ports))
	for i, p := range ports {
		tp[i] = map[string]any{"number": p}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1",
		"kind":       "InferencePool",
		"metadata":   map[string]any{"name": "pool", "namespace": testNS},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": matchLabels},
			"targetPorts":       tp,
			"endpointPickerRef": map[string]any{"name": "epp", "port": map[string]any{"number": int64(9002)}},
		},
	}}
}

type podOpt func(*corev1.Pod)

func ready(v bool) podOpt {
	return func(p *corev1.Pod) {
		s := corev1.ConditionFalse
		if v {
			s = corev1.ConditionTrue
		}
		p.Status.Conditions = []corev1.PodCondition{
			{Type: corev1.ContainersReady, Status: s},
			{Type: corev1.PodReady, Status: s},
		}
	}
}

func withIP(ip string) podOpt { return func(p *corev1.Pod) { p.Status.PodIP = ip } }

func withLabels(kv ...string) podOpt {
	return func(p *corev1.Pod) {
		for i := 0; i+1 < len(kv); i += 2 {
			p.Labels[kv[i]] = kv[i+1]
		}
	}
}

func withAnnotations(kv ...string) podOpt {
	return func(p *corev1.Pod) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		for i := 0; i+1 < len(kv); i += 2 {
			p.Annotations[kv[i]] = kv[i+1]
		}
	}
}

func terminating() podOpt {
	return func(p *corev1.Pod) {
		now := metav1.Now()
		p.DeletionTimestamp = &now
	}
}

func testPod(name string, opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, UID: types.UID("uid-" + name), Labels: map[string]string{}},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func TestPodEndpoints(t *testing.T) {
	cfg := PoolConfig{Name: "p", Namespace: "n"}
	require.NoError(t, cfg.fill())
	withDefaultModel := cfg
	withDefaultModel.DefaultModel = "fallback"

	tests := []struct {
		name        string
		pod         *corev1.Pod
		ports       []int
		cfg         *PoolConfig
		want        []endpoint.Endpoint
		wantProblem string
	}{
		{
			name:  "ready vllm pod, one port",
			pod:   testPod("a", ready(true), withIP("127.0.0.1"), withLabels("app", "x", "omnious.io/model", "m")),
			ports: []int{8000},
			want: []endpoint.Endpoint{{
				Addr: "127.0.0.1:8000", Model: "m", Engine: "vllm", MetricsURL: "http://127.0.0.1:8000/metrics",
				Labels: map[string]string{"app": "x", "omnious.io/model": "m"},
			}},
		},
		{name: "not ready", pod: testPod("a", ready(false), withIP("127.0.0.1")), ports: []int{8000}, cfg: &withDefaultModel},
		{name: "no ready condition", pod: testPod("a", withIP("127.0.0.1")), ports: []int{8000}, cfg: &withDefaultModel},
		{name: "no ip", pod: testPod("a", ready(true)), ports: []int{8000}, cfg: &withDefaultModel},
		{name: "terminating", pod: testPod("a", ready(true), withIP("127.0.0.1"), terminating()), ports: []int{8000}, cfg: &withDefaultModel},
		{
			name:  "data-parallel ranks: ports and annotations step together",
			pod:   testPod("a", ready(true), withIP("127.0.0.1"), withLabels("omnious.io/engine", "sglang"), withAnnotations("omnious.io/model", "org/model", "omnious.io/kv-events-port", "5557", "omnious.io/kv-replay-port", "6000", "omnious.io/metrics-port", "9000")),
			ports: []int{8000, 8001, 8002},
			want: []endpoint.Endpoint{
				{Addr: "127.0.0.1:8000", Model: "org/model", Engine: "sglang", MetricsURL: "http://127.0.0.1:9000/metrics", KVEvents: "tcp://127.0.0.1:5557", KVReplay: "tcp://127.0.0.1:6000", Labels: map[string]string{"omnious.io/engine": "sglang"}},
				{Addr: "127.0.0.1:8001", Model: "org/model", Engine: "sglang", MetricsURL: "http://127.0.0.1:9001/metrics", KVEvents: "tcp://127.0.0.1:5558", KVReplay: "tcp://127.0.0.1:6001", Labels: map[string]string{"omnious.io/engine": "sglang"}},
				{Addr: "127.0.0.1:8002", Model: "org/model", Engine: "sglang", MetricsURL: "http://127.0.0.1:9002/metrics", KVEvents: "tcp://127.0.0.1:5559", KVReplay: "tcp://127.0.0.1:6002", Labels: map[string]string{"omnious.io/engine": "sglang"}},
			},
		},
		{
			name:  "model annotation wins over label, label over default",
			pod:   testPod("a", ready(true), withIP("::1"), withLabels("omnious.io/model", "from-label"), withAnnotations("omnious.io/model", "from/annotation")),
			ports: []int{8000},
			cfg:   &withDefaultModel,
			want: []endpoint.Endpoint{{
				Addr: "[::1]:8000", Model: "from/annotation", Engine: "vllm", MetricsURL: "http://[::1]:8000/metrics",
				Labels: map[string]string{"omnious.io/model": "from-label"},
			}},
		},
		{
			name:  "default model",
			pod:   testPod("a", ready(true), withIP("127.0.0.1")),
			ports: []int{8000},
			cfg:   &withDefaultModel,
			want:  []endpoint.Endpoint{{Addr: "127.0.0.1:8000", Model: "fallback", Engine: "vllm", MetricsURL: "http://127.0.0.1:8000/metrics"}},
		},
		{
			name:        "no model anywhere",
			pod:         testPod("a", ready(true), withIP("127.0.0.1")),
			ports:       []int{8000},
			wantProblem: "no model",
		},
		{
			name:        "unknown engine skips the pod",
			pod:         testPod("a", ready(true), withIP("127.0.0.1"), withLabels("omnious.io/engine", "tgi")),
			ports:       []int{8000},
			cfg:         &withDefaultModel,
			wantProblem: `label omnious.io/engine="tgi"`,
		},
		{
			name:  "ranks that publish by connecting",
			pod:   testPod("a", ready(true), withIP("10.0.0.1"), withAnnotations("omnious.io/kv-events-connect", "true")),
			ports: []int{8000, 8001},
			cfg:   &withDefaultModel,
			want: []endpoint.Endpoint{
				{Addr: "10.0.0.1:8000", Model: "fallback", Engine: "vllm", MetricsURL: "http://10.0.0.1:8000/metrics", KVConnect: true},
				{Addr: "10.0.0.1:8001", Model: "fallback", Engine: "vllm", MetricsURL: "http://10.0.0.1:8001/metrics", KVConnect: true},
			},
		},
		{
			name:  "connecting excludes the port annotations",
			pod:   testPod("a", ready(true), withIP("10.0.0.1"), withAnnotations("omnious.io/kv-events-connect", "true", "omnious.io/kv-events-port", "5557")),
			ports: []int{8000},
			cfg:   &withDefaultModel,
			want: []endpoint.Endpoint{
				{Addr: "10.0.0.1:8000", Model: "fallback", Engine: "vllm", MetricsURL: "http://10.0.0.1:8000/metrics"},
			},
			wantProblem: "annotation omnious.io/kv-events-connect=true excludes omnious.io/kv-events-port and omnious.io/kv-replay-port; KV events ignored",
		},
		{
			name:  "bad connect annotation is ignored",
			pod:   testPod("a", ready(true), withIP("10.0.0.1"), withAnnotations("omnious.io/kv-events-connect", "yes please", "omnious.io/kv-events-port", "5557")),
			ports: []int{8000},
			cfg:   &withDefaultModel,
			want: []endpoint.Endpoint{
				{Addr: "10.0.0.1:8000", Model: "fallback", Engine: "vllm", MetricsURL: "http://10.0.0.1:8000/metrics", KVEvents: "tcp://10.0.0.1:5557"},
			},
			wantProblem: `annotation omnious.io/kv-events-connect="yes please": want true or false; ignored`,
		},
		{
			name:  "bad kv annotation only drops kv events",
			pod:   testPod("a", ready(true), withIP("127.0.0.1"), withAnnotations("omnious.io/kv-events-port", "zmq", "omnious.io/kv-replay-port", "65535")),
			ports: []int{8000, 8001},
			cfg:   &withDefaultModel,
			want: []endpoint.Endpoint{
				{Addr: "127.0.0.1:8000", Model: "fallback", Engine: "vllm", MetricsURL: "http://127.0.0.1:8000/metrics"},
				{Addr: "127.0.0.1:8001", Model: "fallback", Engine: "vllm", MetricsURL: "http://127.0.0.1:8001/metrics"},
			},
			wantProblem: `annotation omnious.io/kv-events-port="zmq": want a port such that port+1 <= 65535; ignored; annotation omnious.io/kv-replay-port="65535"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.cfg
			if c == nil {
				c = &cfg
			}
			got, problem := podEndpoints(tt.pod, tt.ports, c)
			require.Equal(t, tt.want, got)
			if tt.wantProblem == "" {
				require.Empty(t, problem)
			} else {
				require.Contains(t, problem, tt.wantProblem)
			}
		})
	}
}

func TestParsePoolSpec(t *testing.T) {
	tests := []struct {
		name      string
		pool      *unstructured.Unstructured
		wantSel   string
		wantPorts []int
		wantErr   string
	}{
		{name: "one port", pool: testPool(map[string]any{"app": "vllm"}, 8000), wantSel: "app=vllm", wantPorts: []int{8000}},
		{name: "several ports and labels", pool: testPool(map[string]any{"app": "vllm", "tier": "a"}, 8000, 8001), wantSel: "app=vllm,tier=a", wantPorts: []int{8000, 8001}},
		{name: "empty selector", pool: testPool(map[string]any{}, 8000), wantErr: "matchLabels is empty"},
		{name: "bad label value", pool: testPool(map[string]any{"app": "a b"}, 8000), wantErr: "spec.selector.matchLabels"},
		{name: "non-string label", pool: testPool(map[string]any{"app": int64(1)}, 8000), wantErr: "spec.selector.matchLabels"},
		{name: "no ports", pool: testPool(map[string]any{"app": "x"}), wantErr: "targetPorts is empty"},
		{name: "port zero", pool: testPool(map[string]any{"app": "x"}, 0), wantErr: "spec.targetPorts[0].number 0"},
		{name: "port too big", pool: testPool(map[string]any{"app": "x"}, 8000, 70000), wantErr: "spec.targetPorts[1].number 70000"},
		{name: "repeated port", pool: testPool(map[string]any{"app": "x"}, 8000, 8000), wantErr: "repeated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := parsePoolSpec(tt.pool)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.wantSel, spec.selector.String())
			require.Equal(t, tt.wantPorts, spec.ports)
		})
	}
}

func TestNewPoolConfig(t *testing.T) {
	_, err := NewPool(PoolConfig{Name: "p"}, nil, nil, nil)
	require.ErrorContains(t, err, "namespace are required")
	_, err = NewPool(PoolConfig{Name: "p", Namespace: "n", DefaultEngine: "tgi"}, nil, nil, nil)
	require.ErrorContains(t, err, `default engine "tgi"`)
	_, err = NewPool(PoolConfig{Name: "p", Namespace: "n", MetricsPath: "metrics"}, nil, nil, nil)
	require.ErrorContains(t, err, "must start with /")
}

// poolEnv runs a Pool source over fake clientsets.
type poolEnv struct {
	t    *testing.T
	ctx  context.Context
	kube *kubefake.Clientset
	dyn  *dynamicfake.FakeDynamicClient
	u    *updates
}

func startPool(t *testing.T, cfg PoolConfig, pool *unstructured.Unstructured, pods ...*corev1.Pod) *poolEnv {
	t.Helper()
	objs := make([]runtime.Object, len(pods))
	for i, p := range pods {
		objs[i] = p
	}
	var dynObjs []runtime.Object
	if pool != nil {
		dynObjs = append(dynObjs, pool)
	}
	e := &poolEnv{
		t:    t,
		kube: kubefake.NewClientset(objs...),
		dyn: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
			map[schema.GroupVersionResource]string{poolGVR: "InferencePoolList"}, dynObjs...),
		u: newUpdates(),
	}
	cfg.Name, cfg.Namespace = "pool", testNS
	src, err := NewPool(cfg, e.kube, e.dyn, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	e.ctx = ctx
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, e.u.update) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Error("Pool.Run did not return after cancel")
		}
		requireDistinct(t, e.u.all())
	})
	return e
}

func (e *poolEnv) waitAddrs(what string, want ...string) []endpoint.Endpoint {
	e.t.Helper()
	if want == nil {
		want = []string{}
	}
	return e.u.waitFor(e.t, what, func(eps []endpoint.Endpoint) bool { return slices.Equal(addrs(eps), want) })
}

func (e *poolEnv) putPod(p *corev1.Pod) {
	e.t.Helper()
	_, err := e.kube.CoreV1().Pods(p.Namespace).Update(e.ctx, p, metav1.UpdateOptions{})
	require.NoError(e.t, err)
}

func (e *poolEnv) createPod(p *corev1.Pod) {
	e.t.Helper()
	_, err := e.kube.CoreV1().Pods(p.Namespace).Create(e.ctx, p, metav1.CreateOptions{})
	require.NoError(e.t, err)
}

func (e *poolEnv) putPool(pool *unstructured.Unstructured) {
	e.t.Helper()
	_, err := e.dyn.Resource(poolGVR).Namespace(testNS).Update(e.ctx, pool, metav1.UpdateOptions{})
	require.NoError(e.t, err)
}

// podWatches lists the label selectors of the Pod watches opened so far.
func (e *poolEnv) podWatches() []string {
	var sels []string
	for _, a := range e.kube.Actions() {
		if w, ok := a.(k8stesting.WatchAction); ok && a.GetResource().Resource == "pods" {
			sels = append(sels, w.GetWatchRestrictions().Labels.String())
		}
	}
	return sels
}

func TestPoolLifecycle(t *testing.T) {
	app := func(v string) podOpt { return withLabels("app", v, "omnious.io/model", "m") }
	e := startPool(t, PoolConfig{}, testPool(map[string]any{"app": "a"}, 8000),
		testPod("p1", app("a"), ready(true), withIP("127.0.0.1")),
		testPod("p2", app("a"), ready(false), withIP("127.0.0.2")),
		testPod("p3", app("b"), ready(true), withIP("127.0.0.3"), withAnnotations("omnious.io/kv-events-port", "5557")),
		// Same labels, other namespace: never part of the pool.
		&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "elsewhere", Namespace: "other", Labels: map[string]string{"app": "a", "omnious.io/model": "m"}},
			Status:     corev1.PodStatus{PodIP: "127.0.0.9", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		},
	)
	e.waitAddrs("initial ready pod", "127.0.0.1:8000")

	e.putPod(testPod("p2", app("a"), ready(true), withIP("127.0.0.2")))
	e.waitAddrs("p2 ready", "127.0.0.1:8000", "127.0.0.2:8000")

	e.putPod(testPod("p1", app("a"), ready(false), withIP("127.0.0.1")))
	e.waitAddrs("p1 unready", "127.0.0.2:8000")

	e.putPod(testPod("p2", app("a"), ready(true), withIP("127.0.0.4")))
	e.waitAddrs("p2 new ip", "127.0.0.4:8000")

	e.createPod(testPod("p4", app("a"), ready(true), withIP("127.0.0.5")))
	e.waitAddrs("p4 created", "127.0.0.4:8000", "127.0.0.5:8000")

	e.putPod(testPod("p4", app("a"), ready(true), withIP("127.0.0.5"), terminating()))
	e.waitAddrs("p4 terminating", "127.0.0.4:8000")

	// A pod relabelled out of the selector leaves the set.
	e.putPod(testPod("p2", app("c"), ready(true), withIP("127.0.0.4")))
	e.waitAddrs("p2 relabelled", []string{}...)
	e.putPod(testPod("p2", app("a"), ready(true), withIP("127.0.0.4")))
	e.waitAddrs("p2 back", "127.0.0.4:8000")

	// Several target ports: one endpoint per port.
	e.putPool(testPool(map[string]any{"app": "a"}, 8000, 8001))
	e.waitAddrs("two ports", "127.0.0.4:8000", "127.0.0.4:8001")

	// Selector change: the Pod watch is re-created with the new selector.
	e.putPool(testPool(map[string]any{"app": "b"}, 8000, 8001))
	got := e.waitAddrs("selector app=b", "127.0.0.3:8000", "127.0.0.3:8001")
	require.Equal(t, "tcp://127.0.0.3:5557", got[0].KVEvents)
	require.Equal(t, "tcp://127.0.0.3:5558", got[1].KVEvents)
	require.Equal(t, []string{"app=a", "app=b"}, e.podWatches())

	// An invalid spec keeps the last valid one: pod changes still apply.
	e.putPool(testPool(map[string]any{"app": "b"}, 0))
	e.createPod(testPod("p5", app("b"), ready(true), withIP("127.0.0.6")))
	e.waitAddrs("p5 under the kept spec", "127.0.0.3:8000", "127.0.0.3:8001", "127.0.0.6:8000", "127.0.0.6:8001")

	// Pool deleted: empty set, and the Pod watch stops.
	require.NoError(t, e.dyn.Resource(poolGVR).Namespace(testNS).Delete(e.ctx, "pool", metav1.DeleteOptions{}))
	e.waitAddrs("pool deleted", []string{}...)

	// Pool re-created.
	_, err := e.dyn.Resource(poolGVR).Namespace(testNS).Create(e.ctx, testPool(map[string]any{"app": "a"}, 9000), metav1.CreateOptions{})
	require.NoError(t, err)
	e.waitAddrs("pool re-created", "127.0.0.4:9000")
	require.Equal(t, []string{"app=a", "app=b", "app=a"}, e.podWatches())
}

func TestPoolMissingAtStart(t *testing.T) {
	e := startPool(t, PoolConfig{DefaultModel: "m"}, nil, testPod("p1", withLabels("app", "a"), ready(true), withIP("127.0.0.1")))
	e.waitAddrs("no pool yet", []string{}...)
	require.Empty(t, e.podWatches())

	_, err := e.dyn.Resource(poolGVR).Namespace(testNS).Create(e.ctx, testPool(map[string]any{"app": "a"}, 8000), metav1.CreateOptions{})
	require.NoError(t, err)
	eps := e.waitAddrs("pool created", "127.0.0.1:8000")
	require.Equal(t, "m", eps[0].Model)
	require.Equal(t, "vllm", eps[0].Engine)
}

func TestPoolOtherPoolIgnored(t *testing.T) {
	other := testPool(map[string]any{"app": "a"}, 8000)
	other.SetName("not-ours")
	e := startPool(t, PoolConfig{DefaultModel: "m"}, other, testPod("p1", withLabels("app", "a"), ready(true), withIP("127.0.0.1")))
	e.waitAddrs("other pool is not ours", []string{}...)
	require.Len(t, e.u.all(), 1)
}

func TestSlimPod(t *testing.T) {
	p := testPod("a", ready(true), withIP("127.0.0.1"), withLabels("app", "a"), withAnnotations("k", "v"))
	p.Spec.Containers = []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	out, err := slimPod(p)
	require.NoError(t, err)
	slim := out.(*corev1.Pod)
	require.Empty(t, slim.Spec.Containers)
	require.Empty(t, slim.ManagedFields)
	require.Equal(t, []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}, slim.Status.Conditions)
	cfg := PoolConfig{Name: "p", Namespace: "n", DefaultModel: "m"}
	require.NoError(t, cfg.fill())
	full, _ := podEndpoints(p, []int{8000}, &cfg)
	thin, _ := podEndpoints(slim, []int{8000}, &cfg)
	require.Equal(t, full, thin)

	// Tombstones and other objects pass through.
	tomb := "tombstone"
	out, err = slimPod(tomb)
	require.NoError(t, err)
	require.Equal(t, tomb, out)
}
