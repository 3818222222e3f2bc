package kubetest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ReadyPods plays the kubelet in namespace ns until the test ends: every
// Pod there that is not Ready is reported Running and Ready at a loopback
// address (127.0.1.1 upwards), as a kubelet would once its containers
// started. Nothing runs; the Pods' controllers see them ready.
func (e *Env) ReadyPods(t testing.TB, ns string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() {
		for ctx.Err() == nil {
			if err := e.readyPods(ctx, ns); err != nil && ctx.Err() == nil {
				t.Logf("kubetest: kubelet stand-in in %s: %v", ns, err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
}

func (e *Env) readyPods(ctx context.Context, ns string) error {
	pods, err := e.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, pod := range pods.Items {
		if pod.DeletionTimestamp != nil || podReady(&pod) {
			continue
		}
		e.mu.Lock()
		e.podIPs++
		n := e.podIPs
		e.mu.Unlock()
		if err := e.patchPodStatus(ctx, ns, pod.Name, fmt.Sprintf("127.0.%d.%d", 1+n/250, 1+n%250), true); err != nil {
			return err
		}
	}
	return nil
}

// SetPodStatus reports Pod ns/name as its kubelet would: Running at ip,
// Ready or not.
func (e *Env) SetPodStatus(t testing.TB, ns, name, ip string, ready bool) {
	t.Helper()
	if err := e.patchPodStatus(context.Background(), ns, name, ip, ready); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
}

func (e *Env) patchPodStatus(ctx context.Context, ns, name, ip string, ready bool) error {
	s := corev1.ConditionFalse
	if ready {
		s = corev1.ConditionTrue
	}
	now := metav1.Now()
	conds := []map[string]any{{"type": corev1.PodScheduled, "status": corev1.ConditionTrue, "lastTransitionTime": now}}
	for _, c := range []corev1.PodConditionType{corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		conds = append(conds, map[string]any{"type": c, "status": s, "lastTransitionTime": now})
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{
		"phase": corev1.PodRunning, "podIP": ip, "podIPs": []map[string]string{{"ip": ip}},
		"startTime": now, "conditions": conds,
	}})
	if err != nil {
		return err
	}
	// A strategic merge patch merges conditions by type.
	if _, err := e.Kube.CoreV1().Pods(ns).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("pod %s/%s status: %w", ns, name, err)
	}
	return nil
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
