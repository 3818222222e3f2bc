// Package kubetest owns the tests' Kubernetes control plane: a real etcd
// and kube-apiserver, built by scripts/controlplane.sh at the versions
// pinned in controlplane/go.mod, started on 127.0.0.1 with random ports,
// client-certificate and ServiceAccount-token authentication and RBAC
// authorization, and always stopped by their own PIDs.
//
// One control plane serves a whole test package:
//
//	func TestMain(m *testing.M) { kubetest.Main(m) }
//
//	func TestX(t *testing.T) {
//		env := kubetest.Shared(t) // started on first use
//		ns := env.Namespace(t, "x")
//		...
//	}
//
// Start gives a test its own control plane instead. Both fail the test, never
// skip it, when the binaries are missing: make test builds them.
package kubetest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/omnious/provider-node/internal/testutil/freeport"
)

// Options adjust a control plane started by Start, New or Main.
type Options struct {
	// APIServerArgs are extra kube-apiserver flags; a later flag wins over
	// the harness's own (--watch-cache=false, --feature-gates=...).
	APIServerArgs []string
	// ControllerManager also runs kube-controller-manager with the
	// controllers a Deployment needs to get Pods (deployment, replicaset,
	// garbage collector) and those of namespaces and their default
	// ServiceAccount. No scheduler or kubelet runs: ReadyPods plays the
	// kubelet's part.
	ControllerManager bool
}

// Env is one running control plane.
type Env struct {
	// Config is an administrator (group system:masters), to set up what a
	// test needs; the component under test gets a narrower identity from
	// UserConfig or ServiceAccountConfig.
	Config  *rest.Config
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	// Host is the API server's https://127.0.0.1:port.
	Host string
	// EtcdURL is etcd's client URL, http://127.0.0.1:port.
	EtcdURL string

	dir     string
	pki     *pki
	etcd    *proc
	api     *proc
	kcm     *proc
	apiArgs []string
	bins    string

	mu        sync.Mutex
	stopped   bool
	restmaps  *restMapper
	nsCreated map[string]bool
	nsSeq     map[string]int
	podIPs    int
}

var shared struct {
	once sync.Once
	opts Options
	env  *Env
	err  error
}

// Shared returns the test binary's control plane, starting it on first use
// with the options given to Main. The package's TestMain must call Main,
// which stops it.
func Shared(t testing.TB) *Env {
	t.Helper()
	shared.once.Do(func() { shared.env, shared.err = New(shared.opts) })
	if shared.err != nil {
		t.Fatalf("kubetest: %v", shared.err)
	}
	return shared.env
}

// Main runs the package's tests and stops the control plane Shared started
// (with opts, if given); call it from TestMain. It exits the process with
// the tests' status.
func Main(m *testing.M, opts ...Options) {
	if len(opts) > 0 {
		shared.opts = opts[0]
	}
	code := m.Run()
	if shared.env != nil {
		if err := shared.env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "kubetest:", err)
		}
	}
	os.Exit(code)
}

// Start starts a control plane of the test's own, stopped when the test ends.
func Start(t testing.TB, opts Options) *Env {
	t.Helper()
	env, err := New(opts)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("kubetest: %v", err)
		}
	})
	return env
}

// New starts etcd and kube-apiserver and waits until the API server is
// ready (RBAC bootstrap roles included). The caller must call Stop. A port
// taken between choosing and binding it fails one attempt of three.
func New(opts Options) (*Env, error) {
	bins, err := BinDir()
	if err != nil {
		return nil, err
	}
	removeStale()
	var errs []error
	for range 3 {
		env, err := start(bins, opts)
		if err == nil {
			return env, nil
		}
		errs = append(errs, err)
		if !errors.Is(err, errPortTaken) {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// BinDir is the directory holding etcd, kube-apiserver and kubectl:
// $KUBETEST_BINDIR, or the cache scripts/controlplane.sh builds. It is an
// error naming the script when a binary is missing.
func BinDir() (string, error) {
	dir := os.Getenv("KUBETEST_BINDIR")
	if dir == "" {
		root, err := repoRoot()
		if err != nil {
			return "", err
		}
		key, err := cacheKey(filepath.Join(root, "internal", "testutil", "kubetest", "controlplane", "go.mod"))
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, ".cache", "controlplane", key)
	}
	for _, b := range binaries {
		if st, err := os.Stat(filepath.Join(dir, b)); err != nil || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%s is missing: run scripts/controlplane.sh (make test runs it) to build the test control plane", filepath.Join(dir, b))
		}
	}
	return dir, nil
}

// Kubectl is the path of the kubectl built with the control plane.
func Kubectl() (string, error) {
	dir, err := BinDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "kubectl"), nil
}

// repoRoot walks up from the working directory (a package directory under
// go test) to the project's go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(data), "module github.com/omnious/provider-node\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the provider-node module (set KUBETEST_BINDIR)")
		}
		dir = parent
	}
}

// cacheKey names the cache directory after the pinned versions, as
// scripts/controlplane.sh does.
func cacheKey(gomod string) (string, error) {
	data, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	version := func(mod string) string {
		for line := range strings.Lines(string(data)) {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == mod && strings.HasPrefix(f[1], "v") {
				return f[1]
			}
		}
		return ""
	}
	kube, etcd := version("k8s.io/kubernetes"), version("go.etcd.io/etcd/server/v3")
	if kube == "" || etcd == "" {
		return "", fmt.Errorf("%s: no k8s.io/kubernetes or go.etcd.io/etcd/server/v3 version", gomod)
	}
	return "kube-" + kube + "-etcd-" + etcd, nil
}

// binaries are what scripts/controlplane.sh builds.
var binaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kubectl"}

var errPortTaken = errors.New("port taken")

func start(bins string, opts Options) (_ *Env, err error) {
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	e := &Env{dir: dir, bins: bins, nsCreated: map[string]bool{}, nsSeq: map[string]int{}}
	defer func() {
		if err != nil {
			_ = e.Stop()
		}
	}()
	if e.pki, err = newPKI(filepath.Join(dir, "pki")); err != nil {
		return nil, err
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	clientPort, peerPort, apiPort := ports[0], ports[1], ports[2]
	e.EtcdURL = "http://127.0.0.1:" + strconv.Itoa(clientPort)
	peer := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	e.etcd, err = startProc("etcd", filepath.Join(bins, "etcd"), filepath.Join(dir, "etcd.log"),
		"--name=kubetest", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+e.EtcdURL, "--advertise-client-urls="+e.EtcdURL,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer, "--initial-cluster=kubetest="+peer,
		// Test data need not survive a power cut; fsync is most of etcd's
		// write latency on a shared disk.
		"--unsafe-no-fsync", "--log-level=warn")
	if err != nil {
		return nil, err
	}
	if err := waitFor(e.etcd, 30*time.Second, func(ctx context.Context) error { return e.etcdHealthy(ctx) }); err != nil {
		return nil, err
	}

	e.Host = "https://127.0.0.1:" + strconv.Itoa(apiPort)
	p := e.pki
	e.apiArgs = append([]string{
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=" + strconv.Itoa(apiPort),
		"--etcd-servers=" + e.EtcdURL,
		"--cert-dir=" + filepath.Join(dir, "apiserver"),
		"--tls-cert-file=" + p.servingCert, "--tls-private-key-file=" + p.servingKey,
		"--client-ca-file=" + p.caCert,
		"--anonymous-auth=false",
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + p.saPub, "--service-account-signing-key-file=" + p.saKey,
		"--service-cluster-ip-range=10.96.0.0/24",
		"--allow-privileged=true",
		// No kubelet serves the advertised address: keep the
		// "kubernetes" Service's endpoints out of it.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
	}, opts.APIServerArgs...)
	if e.api, err = e.startAPIServer(); err != nil {
		return nil, err
	}
	e.Config = p.clientConfig(e.Host, "kubetest-admin", "system:masters")
	if e.Kube, err = kubernetes.NewForConfig(e.Config); err != nil {
		return nil, err
	}
	if e.Dynamic, err = dynamic.NewForConfig(e.Config); err != nil {
		return nil, err
	}
	if opts.ControllerManager {
		if err := e.startControllerManager(); err != nil {
			return nil, err
		}
	}
	return e, nil
}

func (e *Env) startControllerManager() error {
	kubeconfig := filepath.Join(e.dir, "kube-controller-manager.kubeconfig")
	if err := WriteKubeconfig(e.pki.clientConfig(e.Host, "system:kube-controller-manager", "system:masters"), kubeconfig); err != nil {
		return err
	}
	var err error
	e.kcm, err = startProc("kube-controller-manager", filepath.Join(e.bins, "kube-controller-manager"),
		filepath.Join(e.dir, "kube-controller-manager.log"),
		"--kubeconfig="+kubeconfig, "--leader-elect=false", "--secure-port=0",
		"--controllers=deployment-controller,replicaset-controller,garbage-collector-controller,namespace-controller,serviceaccount-controller")
	if err != nil {
		return err
	}
	// Ready when its ServiceAccount controller gives a new namespace its
	// "default" ServiceAccount.
	probe := "kubetest-controller-manager"
	if _, err := e.Kube.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: probe}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	return waitFor(e.kcm, 2*time.Minute, func(ctx context.Context) error {
		_, err := e.Kube.CoreV1().ServiceAccounts(probe).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

func (e *Env) startAPIServer() (*proc, error) {
	api, err := startProc("kube-apiserver", filepath.Join(e.bins, "kube-apiserver"), filepath.Join(e.dir, "kube-apiserver.log"), e.apiArgs...)
	if err != nil {
		return nil, err
	}
	// A cold start on a busy 2-core machine takes several seconds: the
	// post-start hooks bootstrap RBAC, priority levels and the CRD server.
	admin, err := rest.HTTPClientFor(e.pki.clientConfig(e.Host, "kubetest-admin", "system:masters"))
	if err != nil {
		return nil, err
	}
	err = waitFor(api, 2*time.Minute, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.Host+"/readyz", nil)
		if err != nil {
			return err
		}
		resp, err := admin.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	})
	if err != nil {
		_ = api.stop()
		return nil, err
	}
	return api, nil
}

// RestartAPIServer stops kube-apiserver and starts it again on the same
// port over the same etcd, as a rolling control-plane upgrade does. Every
// watch ends; the new server's watch cache starts from the current etcd
// revision, so a client resuming from an older resourceVersion gets
// 410 Gone and must list again.
func (e *Env) RestartAPIServer(t testing.TB) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.api.stop(); err != nil {
		t.Fatalf("kubetest: stop kube-apiserver: %v", err)
	}
	api, err := e.startAPIServer()
	if err != nil {
		t.Fatalf("kubetest: restart kube-apiserver: %v", err)
	}
	e.api = api
}

// Stop stops kube-apiserver, then etcd, and removes their files. It is
// safe to call more than once.
func (e *Env) Stop() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return nil
	}
	e.stopped = true
	var errs []error
	for _, p := range []*proc{e.kcm, e.api, e.etcd} {
		if p != nil {
			errs = append(errs, p.stop())
		}
	}
	errs = append(errs, os.RemoveAll(e.dir))
	return errors.Join(errs...)
}

// freePorts takes n distinct free ports on 127.0.0.1 (see freeport). They
// are released before the servers bind them; a port taken in between makes
// that server exit at once, and New tries again.
func freePorts(n int) ([]int, error) {
	return freeport.Take(n)
}

// LogFiles are the control-plane processes' logs, for a test that searches
// them (for a secret that must never be logged).
func (e *Env) LogFiles() []string {
	files, _ := filepath.Glob(filepath.Join(e.dir, "*.log"))
	return files
}
