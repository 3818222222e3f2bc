package clustertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/omnious/provider-node/internal/testutil/freeport"
	"github.com/omnious/provider-node/internal/testutil/kubetest"
)

// access is what the chart grants one workload: its ServiceAccount, the
// roles bound to it and the bindings.
type access struct {
	sa       string
	roles    []*unstructured.Unstructured
	bindings []*unstructured.Unstructured
}

// component returns the Deployment of the chart's component
// (app.kubernetes.io/component).
func component(t testing.TB, objs []*unstructured.Unstructured, name string) *unstructured.Unstructured {
	t.Helper()
	for _, d := range find(objs, "Deployment") {
		if d.GetLabels()["app.kubernetes.io/component"] == name {
			return d
		}
	}
	t.Fatalf("no %s Deployment in the render", name)
	return nil
}

// grantsOf collects what the render binds to ServiceAccount sa.
func grantsOf(t testing.TB, objs []*unstructured.Unstructured, sa string) access {
	t.Helper()
	a := access{sa: sa}
	for _, b := range append(find(objs, "RoleBinding"), find(objs, "ClusterRoleBinding")...) {
		subjects, _, _ := unstructured.NestedSlice(b.Object, "subjects")
		if !slices.ContainsFunc(subjects, func(s any) bool {
			m, _ := s.(map[string]any)
			return m["kind"] == "ServiceAccount" && m["name"] == sa
		}) {
			continue
		}
		a.bindings = append(a.bindings, b)
		kind, _, _ := unstructured.NestedString(b.Object, "roleRef", "kind")
		name, _, _ := unstructured.NestedString(b.Object, "roleRef", "name")
		i := slices.IndexFunc(find(objs, kind), func(r *unstructured.Unstructured) bool { return r.GetName() == name })
		require.GreaterOrEqual(t, i, 0, "binding %s refers to %s %s, which the chart does not render", b.GetName(), kind, name)
		a.roles = append(a.roles, find(objs, kind)[i])
	}
	return a
}

// grant is one verb on the resources of one rule of one role.
type grant struct {
	role, rule int
	verb       string
	groups     []string
	resources  []string
}

func (g grant) String() string {
	return fmt.Sprintf("%s %v (groups %q)", g.verb, g.resources, g.groups)
}

func (a access) grants(t testing.TB) []grant {
	t.Helper()
	var out []grant
	for ri, role := range a.roles {
		rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
		for i, r := range rules {
			m := r.(map[string]any)
			groups, _, _ := unstructured.NestedStringSlice(m, "apiGroups")
			resources, _, _ := unstructured.NestedStringSlice(m, "resources")
			verbs, _, _ := unstructured.NestedStringSlice(m, "verbs")
			for _, v := range verbs {
				out = append(out, grant{role: ri, rule: i, verb: v, groups: groups, resources: resources})
			}
		}
	}
	return out
}

// without returns copies of the roles with one verb removed from one rule.
func (a access) without(g grant) []*unstructured.Unstructured {
	roles := make([]*unstructured.Unstructured, len(a.roles))
	for i, r := range a.roles {
		roles[i] = r.DeepCopy()
	}
	rules, _, _ := unstructured.NestedSlice(roles[g.role].Object, "rules")
	m := rules[g.rule].(map[string]any)
	verbs, _, _ := unstructured.NestedStringSlice(m, "verbs")
	verbs = slices.DeleteFunc(verbs, func(v string) bool { return v == g.verb })
	vs := make([]any, len(verbs))
	for i, v := range verbs {
		vs[i] = v
	}
	m["verbs"] = vs
	_ = unstructured.SetNestedSlice(roles[g.role].Object, rules, "rules")
	return roles
}

// apply stores objs in ns.
func apply(t testing.TB, env *kubetest.Env, ns string, objs ...*unstructured.Unstructured) {
	t.Helper()
	var buf bytes.Buffer // a stream of JSON objects, which Decode reads as YAML's
	for _, o := range objs {
		data, err := json.Marshal(o.Object)
		require.NoError(t, err)
		buf.Write(data)
	}
	_, err := env.Apply(context.Background(), buf.Bytes(), kubetest.ApplyOptions{Namespace: ns})
	require.NoError(t, err)
}

// allowed asks the API server whether ServiceAccount ns/sa may do verb on
// resource of group in ns.
func allowed(t testing.TB, env *kubetest.Env, ns, sa, verb, group, resource string) bool {
	t.Helper()
	r, err := env.Kube.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:" + ns + ":" + sa,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: group, Resource: resource},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	return r.Status.Allowed
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ports, err := freeport.Take(1)
	require.NoError(t, err)
	return fmt.Sprintf("127.0.0.1:%d", ports[0])
}

func buildEPP(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "epp")
	out, err := exec.Command("go", "build", "-o", bin, "../../cmd/epp").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

// eppProcess is cmd/epp running as the chart's ServiceAccount.
type eppProcess struct {
	cmd   *exec.Cmd
	admin string
	log   string // its stdout and stderr
	done  chan error
}

func (p *eppProcess) output(t testing.TB) string {
	data, err := os.ReadFile(p.log)
	require.NoError(t, err)
	return string(data)
}

func startEPP(t testing.TB, bin, kubeconfig, pool, ns string) *eppProcess {
	t.Helper()
	p := &eppProcess{admin: freeAddr(t), log: filepath.Join(t.TempDir(), "epp.log"), done: make(chan error, 1)}
	out, err := os.Create(p.log)
	require.NoError(t, err)
	defer out.Close() // the child has its own copy
	p.cmd = exec.Command(bin, "--kubeconfig", kubeconfig, "--pool-name", pool, "--pool-namespace", ns,
		"--standin-tokenizer", "--log-level", "info", "--drain-delay", "0s",
		"--grpc-addr", freeAddr(t), "--health-addr", freeAddr(t), "--metrics-addr", freeAddr(t), "--admin-addr", p.admin)
	p.cmd.Stdout, p.cmd.Stderr = out, out
	require.NoError(t, p.cmd.Start())
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
		}
		if t.Failed() {
			t.Logf("epp output:\n%s", p.output(t))
		}
	})
	return p
}

func (p *eppProcess) endpoints() ([]string, error) {
	resp, err := http.Get("http://" + p.admin + "/debug/endpoints")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var eps []struct {
		Addr string `json:"addr"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&eps); err != nil {
		return nil, err
	}
	out := make([]string, len(eps))
	for i, e := range eps {
		out[i] = e.Addr
	}
	return out, nil
}

// TestEPPRoleIsTheCharts runs cmd/epp with a token of the ServiceAccount
// the chart gives it, bound to exactly the roles the chart renders: it
// discovers the pool's Pods and follows their changes. With any one verb
// removed it exits with an error naming that verb and resource: the Role is
// sufficient and minimal.
func TestEPPRoleIsTheCharts(t *testing.T) {
	env := kubetest.Shared(t)
	own, err := filepath.Glob("../crds/*.yaml") // every CRD the EPP may watch
	require.NoError(t, err)
	env.InstallCRDs(t, own...)
	bin := buildEPP(t)

	// setup renders the chart for a fresh namespace, stores the EPP's
	// ServiceAccount, roles (mutated by edit) and bindings, the chart's
	// InferencePool and one ready Pod it selects.
	type setup struct {
		ns, pool, kubeconfig, addr string
		access                     access
	}
	prepare := func(t *testing.T, edit func(access) []*unstructured.Unstructured) setup {
		ns := namespace(t, env, "epp-rbac")
		objs, err := kubetest.Decode(render(t, ns))
		require.NoError(t, err)
		dep := component(t, objs, "epp").Object
		saName, _, _ := unstructured.NestedString(dep, "spec", "template", "spec", "serviceAccountName")
		require.NotEmpty(t, saName, "the EPP Deployment names no ServiceAccount")
		a := grantsOf(t, objs, saName)
		require.NotEmpty(t, a.roles, "the chart binds no role to the EPP's ServiceAccount %s", saName)
		roles := a.roles
		if edit != nil {
			roles = edit(a)
		}
		i := slices.IndexFunc(find(objs, "ServiceAccount"), func(o *unstructured.Unstructured) bool { return o.GetName() == saName })
		require.GreaterOrEqual(t, i, 0)
		apply(t, env, ns, append(append([]*unstructured.Unstructured{find(objs, "ServiceAccount")[i]}, roles...), a.bindings...)...)

		pools := find(objs, "InferencePool")
		require.Len(t, pools, 1)
		apply(t, env, ns, pools[0])
		sel, _, _ := unstructured.NestedStringMap(pools[0].Object, "spec", "selector", "matchLabels")
		ports, _, _ := unstructured.NestedSlice(pools[0].Object, "spec", "targetPorts")
		port := ports[0].(map[string]any)["number"]
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "engine-0", Labels: sel, Annotations: map[string]string{"omnious.io/model": "Qwen/Qwen3-32B"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Image: "engine:test"}}},
		}
		_, err = env.Kube.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{})
		require.NoError(t, err)
		env.SetPodStatus(t, ns, "engine-0", "127.0.0.87", true)
		return setup{ns: ns, pool: pools[0].GetName(), access: a,
			kubeconfig: env.Kubeconfig(t, env.ServiceAccountConfig(t, ns, saName)),
			addr:       fmt.Sprintf("127.0.0.87:%v", port)}
	}
	// The API server's authorizer learns of new roles through its own
	// informers: wait until it answers for g before starting the EPP.
	settled := func(t *testing.T, s setup, g grant, want bool) {
		for _, res := range g.resources {
			require.Eventually(t, func() bool {
				return allowed(t, env, s.ns, s.access.sa, g.verb, g.groups[0], res) == want
			}, 10*time.Second, 20*time.Millisecond)
		}
	}

	var all []grant
	t.Run("the chart's roles: works", func(t *testing.T) {
		s := prepare(t, nil)
		all = s.access.grants(t)
		require.NotEmpty(t, all)
		for _, g := range all {
			settled(t, s, g, true)
		}
		p := startEPP(t, bin, s.kubeconfig, s.pool, s.ns)
		waitEndpoints(t, p, s.addr)
		env.SetPodStatus(t, s.ns, "engine-0", "127.0.0.87", false)
		waitEndpoints(t, p)
		env.SetPodStatus(t, s.ns, "engine-0", "127.0.0.87", true)
		waitEndpoints(t, p, s.addr)
		require.NotContains(t, strings.ToLower(p.output(t)), "forbidden")
		require.NotContains(t, p.output(t), "RBAC")
	})
	require.NotEmpty(t, all, "the working case did not run")

	for _, g := range all {
		t.Run("without "+g.String(), func(t *testing.T) {
			s := prepare(t, func(a access) []*unstructured.Unstructured { return a.without(g) })
			settled(t, s, g, false)
			p := startEPP(t, bin, s.kubeconfig, s.pool, s.ns)
			select {
			case err := <-p.done:
				require.Error(t, err, "the EPP exited 0 without %s", g)
			case <-time.After(30 * time.Second):
				eps, _ := p.endpoints()
				t.Fatalf("the EPP runs without %s (endpoints %v): the chart's Role grants more than it needs", g, eps)
			}
			out := p.output(t)
			for _, res := range g.resources {
				name := res
				if g.groups[0] != "" {
					name += "." + g.groups[0]
				}
				// One denial lists every missing permission: "cannot list a, list b in namespace".
				require.Regexp(t, `cannot (\S+ \S+, )*`+regexp.QuoteMeta(g.verb+" "+name)+`(, \S+ \S+)* in namespace`, out,
					"the error names neither verb nor resource")
			}
		})
	}
}

func waitEndpoints(t *testing.T, p *eppProcess, want ...string) {
	t.Helper()
	if want == nil {
		want = []string{}
	}
	var got []string
	var err error
	require.Eventually(t, func() bool {
		got, err = p.endpoints()
		return err == nil && slices.Equal(got, want)
	}, 15*time.Second, 50*time.Millisecond, "EPP endpoints %v (%v), want %v", &got, &err, want)
}

// TestQuoterNeedsNoAccess: the quote loop never talks to the API server
// (the quoter package links no Kubernetes client; only cmd/quoter's
// calibrate command does, to write its ConfigMap from the calibration Job
// under an identity of its own), so the chart grants the quoter nothing:
// no token is mounted, no role names its ServiceAccount, and that
// ServiceAccount may not even read the quoter's own key Secret.
func TestQuoterNeedsNoAccess(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "../../quoter").Output()
	require.NoError(t, err)
	require.NotContains(t, string(out), "k8s.io/client-go", "the quoter package links a Kubernetes client")

	env := kubetest.Shared(t)
	ns := namespace(t, env, "quoter-rbac")
	objs, err := kubetest.Decode(render(t, ns))
	require.NoError(t, err)
	spec := component(t, objs, "quoter").Object
	automount, found, _ := unstructured.NestedBool(spec, "spec", "template", "spec", "automountServiceAccountToken")
	require.True(t, found && !automount, "the quoter's Pod mounts a ServiceAccount token")
	sa, _, _ := unstructured.NestedString(spec, "spec", "template", "spec", "serviceAccountName")
	if sa == "" {
		sa = "default"
	}
	require.Empty(t, grantsOf(t, objs, sa).roles, "the chart binds a role to the quoter's ServiceAccount %s", sa)

	// Stored as rendered, the chart leaves that ServiceAccount powerless.
	_, err = env.Apply(context.Background(), render(t, ns), kubetest.ApplyOptions{Namespace: ns})
	require.NoError(t, err)
	for _, verb := range []string{"get", "list", "watch"} {
		for _, res := range []string{"secrets", "pods", "configmaps"} {
			require.False(t, allowed(t, env, ns, sa, verb, "", res), "the quoter's ServiceAccount may %s %s", verb, res)
		}
	}
}
