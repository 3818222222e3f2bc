package clustertest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/omnious/provider-node/internal/testutil/kubetest"
)

func TestMain(m *testing.M) {
	// install.sh waits for its Deployments: their controllers must run.
	kubetest.Main(m, kubetest.Options{ControllerManager: true})
}

const (
	helmDir = "../helm"
	chart   = "../helm/provider-node"
	// The Kubernetes version check.sh renders for.
	renderKubeVersion = "1.33.0"
)

// tool finds a program on PATH or in the Go bin directory, where
// deploy/tools.sh installs helm.
func tool(t testing.TB, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	out, err := exec.Command("go", "env", "GOPATH").Output()
	require.NoError(t, err)
	p := filepath.Join(strings.TrimSpace(string(out)), "bin", name)
	_, err = os.Stat(p)
	require.NoError(t, err, "%s not found: run deploy/tools.sh (make deps)", name)
	return p
}

func modCache(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	require.NoError(t, err)
	return strings.TrimSpace(string(out))
}

// combination is one line of deploy/helm/ci/renders.txt.
type combination struct {
	name string
	args []string
}

func combinations(t testing.TB) []combination {
	t.Helper()
	f, err := os.Open(filepath.Join(helmDir, "ci", "renders.txt"))
	require.NoError(t, err)
	defer f.Close()
	var out []combination
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		out = append(out, combination{name: fields[0], args: fields[1:]})
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, out)
	return out
}

// render runs helm template as check.sh does, for release namespace ns.
func render(t testing.TB, ns string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(tool(t, "helm"), append([]string{"template", "pn", "provider-node", "--kube-version", renderKubeVersion,
		"--namespace", ns, "-f", "ci/base.yaml"}, args...)...)
	cmd.Dir = helmDir
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "helm template %v: %s", args, stderr.String())
	return out
}

// crds are the CustomResourceDefinitions the chart's objects need: the
// project's own (deploy/crds) and, from the Go module cache where
// deploy/tools.sh puts them for check.sh, KEDA's, the Prometheus
// Operator's and the Gateway API's.
func crds(t testing.TB) []string {
	t.Helper()
	own, err := filepath.Glob("../crds/*.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, own)
	mc := modCache(t)
	promop := filepath.Join(mc, "github.com/prometheus-operator/prometheus-operator@v0.85.0/example/prometheus-operator-crd-full")
	others := []string{
		filepath.Join(mc, "github.com/kedacore/keda/v2@v2.21.0/config/crd/bases/keda.sh_scaledobjects.yaml"),
		filepath.Join(promop, "monitoring.coreos.com_servicemonitors.yaml"),
		filepath.Join(promop, "monitoring.coreos.com_prometheusrules.yaml"),
		filepath.Join(mc, "sigs.k8s.io/gateway-api@v1.6.3/config/crd/standard/gateway.networking.k8s.io_httproutes.yaml"),
	}
	for _, f := range others {
		_, err := os.Stat(f)
		require.NoError(t, err, "run deploy/tools.sh (make deps): it downloads the modules holding these CRDs")
	}
	return append(own, others...)
}

// namespace is a new namespace named after what (namespaces are not reused
// between tests).
func namespace(t testing.TB, env *kubetest.Env, what string) string {
	t.Helper()
	name := strings.Trim(regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(what), "-"), "-")
	return env.FreshNamespace(t, fmt.Sprintf("%.50s", name))
}

// find returns the objects of kind in objs.
func find(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}
