package clustertest

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/omnious/provider-node/internal/testutil/kubetest"
)

// installerTools are the programs install.sh runs. The installer's PATH
// holds only wrappers of these, which record each call's argv and
// environment before running the real program, so every process the
// installer starts is seen (a program missing here fails the run).
var installerTools = []string{"awk", "cat", "chmod", "dirname", "grep", "head", "mktemp", "rm", "sed", "stat", "tr", "kubectl", "helm"}

type installer struct {
	t                         *testing.T
	work, path, argv, environ string
	base                      []string // the environment of every run
	outputs                   []string
}

func newInstaller(t *testing.T, env *kubetest.Env) *installer {
	work := t.TempDir()
	in := &installer{t: t, work: work, path: filepath.Join(work, "bin"),
		argv: filepath.Join(work, "argv.log"), environ: filepath.Join(work, "environ.log")}
	require.NoError(t, os.Mkdir(in.path, 0o755))
	kubectl, err := kubetest.Kubectl()
	require.NoError(t, err)
	real := map[string]string{"kubectl": kubectl, "helm": tool(t, "helm")}
	for _, name := range installerTools {
		if real[name] == "" {
			real[name] = tool(t, name)
		}
		// printf and export are bash builtins: the wrapper starts no
		// process before the real program.
		script := fmt.Sprintf("#!/bin/bash\n{ printf '%%s' %q; printf ' %%q' \"$@\"; printf '\\n'; } >>\"$SHIM_ARGV\"\n"+
			"{ printf '== %%s\\n' %q; export -p; } >>\"$SHIM_ENVIRON\"\nexec %q \"$@\"\n", name, name, real[name])
		require.NoError(t, os.WriteFile(filepath.Join(in.path, name), []byte(script), 0o755))
	}
	in.base = []string{
		"PATH=" + in.path, "HOME=" + work, "TMPDIR=" + work,
		"KUBECONFIG=" + env.Kubeconfig(t, env.Config),
		"SHIM_ARGV=" + in.argv, "SHIM_ENVIRON=" + in.environ,
		"HELM_CACHE_HOME=" + filepath.Join(work, "helm-cache"), "HELM_CONFIG_HOME=" + filepath.Join(work, "helm-config"),
		"HELM_DATA_HOME=" + filepath.Join(work, "helm-data"),
		"HELM_TIMEOUT=5m",
		// A setup.sh result left in the tree must not steer these runs.
		"TOOL_PROFILE_ENV=" + filepath.Join(work, "none.env"),
	}
	return in
}

// run runs install.sh with the runbook's inputs plus vars, stdin on its
// standard input, and args. The conformance test (helm test) is skipped:
// no kubelet runs its Pod here.
func (in *installer) run(stdin string, vars []string, args ...string) {
	in.t.Helper()
	cmd := exec.Command("/bin/bash", append([]string{"../install.sh", "--skip-test"}, args...)...)
	cmd.Env = append(append(slices.Clone(in.base),
		"PROVIDER_ID=acme-qwen", "MODEL_ID=Qwen/Qwen2.5-72B-Instruct", "MODEL_CLASS=qwen2.5-72b",
		"FLOOR_IN=210000", "FLOOR_OUT=680000", "HF_TOKEN="+hfToken), vars...)
	cmd.Stdin = strings.NewReader(stdin)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	in.outputs = append(in.outputs, string(out))
	require.NoError(in.t, err, "install.sh %v:\n%s", args, out)
	require.NotContains(in.t, string(out), "command not found")
	in.t.Logf("install.sh %v: %s", args, time.Since(start).Round(time.Millisecond))
}

const hfToken = "hf_clustertest_token_value"

func randomKey(t *testing.T) string {
	b := make([]byte, 32)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// releases decodes every Helm release record in ns (Secrets of type
// helm.sh/release.v1: base64 of gzipped JSON), by name.
func releases(t *testing.T, env *kubetest.Env, ns string) map[string][]byte {
	t.Helper()
	list, err := env.Kube.CoreV1().Secrets(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "owner=helm"})
	require.NoError(t, err)
	out := map[string][]byte{}
	for _, s := range list.Items {
		require.Equal(t, "helm.sh/release.v1", string(s.Type))
		gz, err := base64.StdEncoding.DecodeString(string(s.Data["release"]))
		require.NoError(t, err)
		r, err := gzip.NewReader(bytes.NewReader(gz))
		require.NoError(t, err)
		data, err := io.ReadAll(r)
		require.NoError(t, err)
		out[s.Name] = data
	}
	return out
}

func releaseStatus(t *testing.T, record []byte) (string, int) {
	var r struct {
		Info struct {
			Status string `json:"status"`
		} `json:"info"`
		Version int `json:"version"`
	}
	require.NoError(t, json.Unmarshal(record, &r))
	return r.Info.Status, r.Version
}

func requireAvailable(t *testing.T, env *kubetest.Env, ns string) []appsv1.Deployment {
	t.Helper()
	list, err := env.Kube.AppsV1().Deployments(ns).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	require.NotEmpty(t, list.Items)
	for _, d := range list.Items {
		require.Equal(t, *d.Spec.Replicas, d.Status.ReadyReplicas, "deployment %s/%s", ns, d.Name)
	}
	return list.Items
}

// TestInstall runs deploy/install.sh against the API server as the runbook
// shows it (PROVIDER_KEY=0x... on the command line), again with the same
// inputs, then for a second environment with the key on stdin. The key
// reaches the cluster only as the Secret; it is in no argv or environment
// of a program the installer started, no output, no control-plane log, no
// Helm release record and no ConfigMap.
func TestInstall(t *testing.T) {
	env := kubetest.Shared(t)
	ctx := context.Background()
	jobs := map[string]*seenJobs{}
	for _, ns := range []string{"omnious-mainnet", "omnious-staging"} {
		env.ReadyPods(t, ns)
		jobs[ns] = completeJobs(t, env, ns)
	}
	in := newInstaller(t, env)
	key, stagingKey := randomKey(t), randomKey(t)

	in.run("", []string{"PROVIDER_KEY=0x" + key, "SLO_TTFT_P95=3s", "SLO_ITL_P95=40ms"})
	require.Len(t, jobs["omnious-mainnet"].all(), 1, "one calibration Job after the install")
	requireCalibration(t, env, "omnious-mainnet", "provider-node-mainnet", "3s", "40ms", jobs["omnious-mainnet"].all()[0])
	secret, err := env.Kube.CoreV1().Secrets("omnious-mainnet").Get(ctx, "provider-node-mainnet-quoter-key", metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, "0x"+key+"\n", string(secret.Data["key"]))
	hf, err := env.Kube.CoreV1().Secrets("omnious-mainnet").Get(ctx, "provider-node-mainnet-hf-token", metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, hfToken, string(hf.Data["HF_TOKEN"]))
	rel := releases(t, env, "omnious-mainnet")
	status, version := releaseStatus(t, rel["sh.helm.release.v1.provider-node-mainnet.v1"])
	require.Equal(t, "deployed", status)
	require.Equal(t, 1, version)
	deployments := requireAvailable(t, env, "omnious-mainnet")

	// Re-run: an upgrade to revision 2 that changes nothing stored, and
	// calibrates again.
	in.run("", []string{"PROVIDER_KEY=0x" + key, "SLO_TTFT_P95=3s", "SLO_ITL_P95=40ms"})
	require.Len(t, jobs["omnious-mainnet"].all(), 2, "a calibration Job after the upgrade")
	requireCalibration(t, env, "omnious-mainnet", "provider-node-mainnet", "3s", "40ms", jobs["omnious-mainnet"].all()[1])
	again, err := env.Kube.CoreV1().Secrets("omnious-mainnet").Get(ctx, "provider-node-mainnet-quoter-key", metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, secret.ResourceVersion, again.ResourceVersion, "re-run rewrote the key Secret")
	rel = releases(t, env, "omnious-mainnet")
	require.Len(t, rel, 2)
	status, _ = releaseStatus(t, rel["sh.helm.release.v1.provider-node-mainnet.v2"])
	require.Equal(t, "deployed", status)
	for _, d := range requireAvailable(t, env, "omnious-mainnet") {
		i := slices.IndexFunc(deployments, func(o appsv1.Deployment) bool { return o.Name == d.Name })
		require.GreaterOrEqual(t, i, 0, "re-run added deployment %s", d.Name)
		require.Equal(t, deployments[i].Generation, d.Generation, "re-run changed deployment %s", d.Name)
	}

	// Another environment: its own namespace, release and key, from stdin.
	in.run("0x"+stagingKey+"\n", []string{"PROVIDER_KEY=-"}, "--env", "staging")
	require.Len(t, jobs["omnious-staging"].all(), 1)
	requireCalibration(t, env, "omnious-staging", "provider-node-staging", "2s", "50ms", jobs["omnious-staging"].all()[0])
	staging, err := env.Kube.CoreV1().Secrets("omnious-staging").Get(ctx, "provider-node-staging-quoter-key", metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, "0x"+stagingKey+"\n", string(staging.Data["key"]))
	srel := releases(t, env, "omnious-staging")
	status, version = releaseStatus(t, srel["sh.helm.release.v1.provider-node-staging.v1"])
	require.Equal(t, "deployed", status)
	require.Equal(t, 1, version)
	requireAvailable(t, env, "omnious-staging")
	require.Len(t, releases(t, env, "omnious-mainnet"), 2, "installing staging touched mainnet's release")

	// Everything the installer and the cluster recorded, searched for the
	// secrets in every form they were handled in.
	captured := map[string][]byte{}
	for i, out := range in.outputs {
		captured[fmt.Sprintf("install.sh output %d", i+1)] = []byte(out)
	}
	for _, f := range []string{in.argv, in.environ} {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		captured[filepath.Base(f)] = data
	}
	argv := string(captured["argv.log"])
	require.Contains(t, argv, "kubectl apply -n omnious-mainnet -f -", "the argv capture missed the key's kubectl")
	require.Contains(t, argv, "helm upgrade --install provider-node-staging")
	for _, f := range env.LogFiles() {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		captured[filepath.Base(f)] = data
	}
	for _, ns := range []string{"omnious-mainnet", "omnious-staging"} {
		for name, data := range releases(t, env, ns) {
			captured["helm release "+ns+"/"+name] = data
		}
		cms, err := env.Kube.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		data, err := json.Marshal(cms)
		require.NoError(t, err)
		captured["configmaps "+ns] = data
	}
	b64 := base64.StdEncoding.EncodeToString
	secrets := map[string]string{
		"mainnet key":                 key,
		"staging key":                 stagingKey,
		"mainnet key (Secret data)":   b64([]byte("0x" + key + "\n")),
		"staging key (Secret data)":   b64([]byte("0x" + stagingKey + "\n")),
		"HF token":                    hfToken,
		"HF token (Secret data)":      b64([]byte(hfToken)),
		"mainnet key, upper-case hex": strings.ToUpper(key),
	}
	for where, data := range captured {
		for what, s := range secrets {
			// Not require.NotContains: its message would print the secret.
			if i := bytes.Index(data, []byte(s)); i >= 0 {
				t.Errorf("the %s is in %s, at byte %d", what, where, i)
			}
		}
	}
}

// completeJobs plays the Job controller for the Helm hook Jobs of ns
// until the test ends: each Job is reported finished, as its controller
// would once its Pod succeeded (no kubelet runs it here), so
// `helm upgrade --install --wait` gets past its post-install hook. Each
// Job is recorded, as the API server stored it, before it is completed.
func completeJobs(t *testing.T, env *kubetest.Env, ns string) *seenJobs {
	t.Helper()
	seen := &seenJobs{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if err := completeJobsOnce(ctx, env, ns, seen); err != nil && ctx.Err() == nil {
				t.Logf("job controller stand-in in %s: %v", ns, err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return seen
}

type seenJobs struct {
	mu   sync.Mutex
	jobs []batchv1.Job
}

func (s *seenJobs) all() []batchv1.Job {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.jobs)
}

func completeJobsOnce(ctx context.Context, env *kubetest.Env, ns string, seen *seenJobs) error {
	jobs, err := env.Kube.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, j := range jobs.Items {
		if j.DeletionTimestamp != nil || j.Status.CompletionTime != nil {
			continue
		}
		seen.mu.Lock()
		seen.jobs = append(seen.jobs, *j.DeepCopy())
		seen.mu.Unlock()
		start := metav1.NewTime(time.Now().Add(-time.Second))
		now := metav1.Now()
		j.Status = batchv1.JobStatus{
			StartTime: &start, CompletionTime: &now, Succeeded: 1,
			Conditions: []batchv1.JobCondition{
				{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastTransitionTime: now, LastProbeTime: now},
				{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: now, LastProbeTime: now},
			},
		}
		if _, err := env.Kube.BatchV1().Jobs(ns).UpdateStatus(ctx, &j, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("complete job %s: %w", j.Name, err)
		}
	}
	return nil
}

// requireCalibration checks what the installer's release runs in ns: the
// quoter gets the objectives and the calibration file, and the calibration
// hook Job (one per install or upgrade) calibrates against the same
// objectives as its own ServiceAccount, bound to a Role that may create
// ConfigMaps and read or change only the calibration's, with no Secret
// mounted and no environment taken from one.
func requireCalibration(t *testing.T, env *kubetest.Env, ns, release, ttft, itl string, job batchv1.Job) {
	t.Helper()
	ctx := context.Background()
	quoter, err := env.Kube.AppsV1().Deployments(ns).Get(ctx, release+"-quoter", metav1.GetOptions{})
	require.NoError(t, err)
	qenv := map[string]string{}
	for _, e := range quoter.Spec.Template.Spec.Containers[0].Env {
		qenv[e.Name] = e.Value
	}
	require.Equal(t, ttft, qenv["SLO_TTFT_P95"])
	require.Equal(t, itl, qenv["SLO_ITL_P95"])
	require.Equal(t, "/etc/omnious-quoter/calibration/calibration.json", qenv["QUOTER_CALIBRATION_FILE"])
	cmName := release + "-calibration"
	i := slices.IndexFunc(quoter.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.ConfigMap != nil && v.ConfigMap.Name == cmName })
	require.GreaterOrEqual(t, i, 0, "the quoter does not mount ConfigMap %s", cmName)
	require.True(t, *quoter.Spec.Template.Spec.Volumes[i].ConfigMap.Optional, "the quoter needs the calibration to start")

	require.Equal(t, "post-install,post-upgrade", job.Annotations["helm.sh/hook"])
	spec := job.Spec.Template.Spec
	// The Job holds the EPP's admin token (to read capacity) and the
	// calibration token (to mark its requests), never the signing key.
	var secrets []string
	for _, v := range spec.Volumes {
		if v.Secret != nil {
			secrets = append(secrets, v.Secret.SecretName)
		}
		require.Nil(t, v.Projected, "the calibration Job mounts projected volume %s", v.Name)
	}
	require.ElementsMatch(t, []string{release + "-epp-admin", release + "-calibration"}, secrets,
		"the calibration Job mounts only the admin and calibration tokens")
	require.Len(t, spec.Containers, 1)
	require.Empty(t, spec.InitContainers)
	c := spec.Containers[0]
	for _, e := range c.Env {
		require.Nil(t, e.ValueFrom, "the calibration Job takes env %s from elsewhere", e.Name)
	}
	require.Empty(t, c.EnvFrom)
	require.Equal(t, []string{"quoter"}, c.Command)
	require.Equal(t, "calibrate", c.Args[0])
	require.Subset(t, c.Args, []string{"--slo-ttft-p95=" + ttft, "--slo-itl-p95=" + itl, "--configmap=" + cmName,
		"--url=http://" + release + "-proxy." + ns + ".svc:80", "--capacity-url=http://" + release + "-epp." + ns + ".svc:9091"})

	require.NotEqual(t, "", spec.ServiceAccountName)
	require.NotEqual(t, "default", spec.ServiceAccountName)
	bindings, err := env.Kube.RbacV1().RoleBindings(ns).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	var roles []string
	for _, b := range bindings.Items {
		if slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool { return s.Kind == "ServiceAccount" && s.Name == spec.ServiceAccountName }) {
			require.Equal(t, "Role", b.RoleRef.Kind)
			roles = append(roles, b.RoleRef.Name)
		}
	}
	require.Len(t, roles, 1, "the calibration ServiceAccount's roles")
	role, err := env.Kube.RbacV1().Roles(ns).Get(ctx, roles[0], metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{cmName}, Verbs: []string{"get", "update"}},
	}, role.Rules)
	crbs, err := env.Kube.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	for _, b := range crbs.Items {
		require.False(t, slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == "ServiceAccount" && s.Name == spec.ServiceAccountName && s.Namespace == ns
		}), "ClusterRoleBinding %s names the calibration ServiceAccount", b.Name)
	}
}
