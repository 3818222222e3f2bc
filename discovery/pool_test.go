package discovery

import (
	"testing"

	"github.com/omnious/provider-node/endpoint"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
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
