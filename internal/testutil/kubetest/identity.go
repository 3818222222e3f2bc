package kubetest

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// UserConfig is a REST config for user in groups, authenticated by a
// client certificate from the control plane's CA. RBAC decides what it may
// do: nothing, until a test binds it a role.
func (e *Env) UserConfig(user string, groups ...string) *rest.Config {
	return e.pki.clientConfig(e.Host, user, groups...)
}

// Namespace creates namespace name (if absent) with its "default"
// ServiceAccount, which the controller manager would create and Pod
// admission requires. Namespaces are never deleted: without the controller
// manager a deleted namespace stays Terminating, so tests use unique names.
func (e *Env) Namespace(t testing.TB, name string) string {
	t.Helper()
	e.mu.Lock()
	done := e.nsCreated[name]
	e.mu.Unlock()
	if done {
		return name
	}
	ctx := context.Background()
	_, err := e.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("kubetest: create namespace %s: %v", name, err)
	}
	e.serviceAccount(t, name, "default")
	e.mu.Lock()
	e.nsCreated[name] = true
	e.mu.Unlock()
	return name
}

// FreshNamespace creates a namespace no test of this process has had,
// prefix-1, prefix-2 and so on: a test run again (go test -count) must not
// meet the objects its earlier run left.
func (e *Env) FreshNamespace(t testing.TB, prefix string) string {
	t.Helper()
	e.mu.Lock()
	e.nsSeq[prefix]++
	name := fmt.Sprintf("%s-%d", prefix, e.nsSeq[prefix])
	e.mu.Unlock()
	return e.Namespace(t, name)
}

func (e *Env) serviceAccount(t testing.TB, ns, name string) {
	t.Helper()
	_, err := e.Kube.CoreV1().ServiceAccounts(ns).Create(context.Background(),
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("kubetest: create serviceaccount %s/%s: %v", ns, name, err)
	}
}

// ServiceAccountConfig is a REST config carrying a token the API server
// issued (TokenRequest) for ServiceAccount ns/name, created if absent: the
// identity a Pod running as that ServiceAccount has.
func (e *Env) ServiceAccountConfig(t testing.TB, ns, name string) *rest.Config {
	t.Helper()
	e.Namespace(t, ns)
	e.serviceAccount(t, ns, name)
	ttl := int64(time.Hour / time.Second)
	tok, err := e.Kube.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubetest: token for serviceaccount %s/%s: %v", ns, name, err)
	}
	return &rest.Config{
		Host:            e.Host,
		BearerToken:     tok.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: e.pki.caPEM},
		QPS:             -1,
	}
}

// Kubeconfig writes rc (its server, CA, and token or client certificate)
// as a kubeconfig file in the test's temporary directory and returns its
// path, for a process under test (--kubeconfig, KUBECONFIG).
func (e *Env) Kubeconfig(t testing.TB, rc *rest.Config) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := WriteKubeconfig(rc, path); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	return path
}

// WriteKubeconfig writes rc as a kubeconfig file (mode 0600) at path.
func WriteKubeconfig(rc *rest.Config, path string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData}
	cfg.AuthInfos["kubetest"] = &clientcmdapi.AuthInfo{
		Token:                 rc.BearerToken,
		ClientCertificateData: rc.CertData,
		ClientKeyData:         rc.KeyData,
	}
	cfg.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: "kubetest"}
	cfg.CurrentContext = "kubetest"
	return clientcmd.WriteToFile(*cfg, path)
}
