package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/omnious/provider-node/internal/kubetest"
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
	ns := env.Namespace(t, "calibration-admin")
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
	ns := env.Namespace(t, "calibration-errors")
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
