package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
)

// calibrationKey is the one key of the calibration ConfigMap; the chart
// mounts it into the quoter as its calibration file.
const calibrationKey = "calibration.json"

// calibrationLabels mark the ConfigMap as the quoter's own: Helm does not
// render it (an upgrade would otherwise wipe the calibration), so these
// labels are how an operator finds it.
var calibrationLabels = map[string]string{
	"app.kubernetes.io/managed-by": "omnious-quoter",
	"app.kubernetes.io/component":  "calibration",
}

// podNamespaceFile is where the kubelet puts a Pod's namespace next to
// its ServiceAccount token.
const podNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// saveCalibrationConfigMap creates ConfigMap name in namespace, or
// updates it, so that its only key is calibration.json = data. It talks
// to the API server of $KUBECONFIG when that is set, else to the one of
// the Pod it runs in; namespace "" is then the kubeconfig context's
// namespace ("default" when it names none, as for kubectl) or the Pod's own.
//
// The RBAC it needs: create on configmaps in the namespace, and get and
// update on that one ConfigMap.
func saveCalibrationConfigMap(ctx context.Context, namespace, name string, data []byte) error {
	if name == "" {
		return errors.New("calibration ConfigMap: no name")
	}
	// A ConfigMap's data is text; invalid UTF-8 would be altered in transit.
	if !utf8.Valid(data) {
		return fmt.Errorf("calibration ConfigMap %s: the calibration is not UTF-8 text", name)
	}
	rc, ns, err := kubeClientConfig()
	if err != nil {
		return fmt.Errorf("calibration ConfigMap %s: %w", name, err)
	}
	if namespace == "" {
		namespace = ns
	}
	rc.UserAgent = "omnious-quoter-calibrate"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("calibration ConfigMap %s/%s: %w", namespace, name, err)
	}
	return putCalibration(ctx, cs.CoreV1().ConfigMaps(namespace), namespace, name, string(data))
}

// kubeClientConfig is $KUBECONFIG's current context and its namespace
// when KUBECONFIG is set, else the in-cluster config and the Pod's
// namespace.
func kubeClientConfig() (*rest.Config, string, error) {
	if os.Getenv("KUBECONFIG") != "" {
		cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(clientcmd.NewDefaultClientConfigLoadingRules(), nil)
		rc, err := cc.ClientConfig()
		if err != nil {
			return nil, "", fmt.Errorf("load KUBECONFIG: %w", err)
		}
		ns, _, err := cc.Namespace()
		if err != nil {
			return nil, "", fmt.Errorf("KUBECONFIG namespace: %w", err)
		}
		return rc, ns, nil
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, "", fmt.Errorf("not in a cluster and KUBECONFIG is not set: %w", err)
	}
	b, err := os.ReadFile(podNamespaceFile)
	if err != nil {
		return nil, "", fmt.Errorf("the Pod's namespace: %w", err)
	}
	ns := strings.TrimSpace(string(b))
	if ns == "" {
		return nil, "", fmt.Errorf("the Pod's namespace: %s is empty", podNamespaceFile)
	}
	return rc, ns, nil
}

// putCalibration creates the ConfigMap, or when it exists replaces its
// data by the calibration and adds the labels, keeping any other labels
// and annotations an operator set. An update that loses a race with
// another writer starts over from a fresh read.
func putCalibration(ctx context.Context, cms typedcorev1.ConfigMapInterface, namespace, name, data string) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			cm = &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: maps.Clone(calibrationLabels)},
				Data:       map[string]string{calibrationKey: data},
			}
			_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				// Created since the read: update it on the next attempt.
				return apierrors.NewConflict(corev1.Resource("configmaps"), name, err)
			}
			if err != nil {
				return fmt.Errorf("create ConfigMap %s/%s: %w", namespace, name, err)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("get ConfigMap %s/%s: %w", namespace, name, err)
		}
		if cm.Labels == nil {
			cm.Labels = map[string]string{}
		}
		maps.Copy(cm.Labels, calibrationLabels)
		cm.Data = map[string]string{calibrationKey: data}
		cm.BinaryData = nil
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			if apierrors.IsConflict(err) {
				return err
			}
			return fmt.Errorf("update ConfigMap %s/%s: %w", namespace, name, err)
		}
		return nil
	})
	if apierrors.IsConflict(err) {
		return fmt.Errorf("update ConfigMap %s/%s: still conflicting after retries: %w", namespace, name, err)
	}
	return err
}
