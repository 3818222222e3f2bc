package kubetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

type restMapper = restmapper.DeferredDiscoveryRESTMapper

// FieldManager is the server-side apply field manager of Apply and
// InstallCRDs.
const FieldManager = "kubetest"

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// Decode splits a YAML (or JSON) stream into its objects, skipping empty
// documents.
func Decode(manifest []byte) ([]*unstructured.Unstructured, error) {
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	var objs []*unstructured.Unstructured
	for i := 0; ; i++ {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return objs, nil
		} else if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// ApplyOptions adjust Apply.
type ApplyOptions struct {
	// Namespace for namespaced objects that name none.
	Namespace string
	// DryRun asks the API server to admit and validate each object
	// (schema, defaulting, admission) without storing it.
	DryRun bool
}

// Apply server-side-applies every object of manifest, in order, and
// returns them as the API server answered. The first object the API
// server refuses ends it with an error naming the object.
func (e *Env) Apply(ctx context.Context, manifest []byte, opts ApplyOptions) ([]*unstructured.Unstructured, error) {
	objs, err := Decode(manifest)
	if err != nil {
		return nil, err
	}
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, obj := range objs {
		got, err := e.applyOne(ctx, obj, opts)
		if err != nil {
			return out, fmt.Errorf("%s %s: %w", obj.GetKind(), objectName(obj), err)
		}
		out = append(out, got)
	}
	return out, nil
}

func objectName(obj *unstructured.Unstructured) string {
	if ns := obj.GetNamespace(); ns != "" {
		return ns + "/" + obj.GetName()
	}
	return obj.GetName()
}

func (e *Env) applyOne(ctx context.Context, obj *unstructured.Unstructured, opts ApplyOptions) (*unstructured.Unstructured, error) {
	gvk := obj.GroupVersionKind()
	mapping, err := e.mapper().RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		// A CRD installed since the mapper last looked.
		e.mapper().Reset()
		mapping, err = e.mapper().RESTMapping(gvk.GroupKind(), gvk.Version)
	}
	if err != nil {
		return nil, err
	}
	// Strict: a field the schema does not know is an error, not a warning.
	po := metav1.PatchOptions{FieldManager: FieldManager, Force: ptr(true), FieldValidation: "Strict"}
	if opts.DryRun {
		po.DryRun = []string{metav1.DryRunAll}
	}
	var client dynamic.ResourceInterface = e.Dynamic.Resource(mapping.Resource)
	if mapping.Scope.Name() != meta.RESTScopeNameRoot {
		if obj.GetNamespace() == "" {
			obj = obj.DeepCopy()
			obj.SetNamespace(opts.Namespace)
		}
		client = e.Dynamic.Resource(mapping.Resource).Namespace(obj.GetNamespace())
	}
	data, err := json.Marshal(obj.Object)
	if err != nil {
		return nil, err
	}
	return client.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, po)
}

func ptr[T any](v T) *T { return &v }

func (e *Env) mapper() *restMapper {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.restmaps == nil {
		e.restmaps = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(e.Kube.Discovery()))
	}
	return e.restmaps
}

// InstallCRDs applies the CustomResourceDefinitions in the given YAML files
// and waits until each is Established and its resources are served.
func (e *Env) InstallCRDs(t testing.TB, paths ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("kubetest: %v", err)
		}
		objs, err := Decode(data)
		if err != nil {
			t.Fatalf("kubetest: %s: %v", path, err)
		}
		for _, obj := range objs {
			if obj.GroupVersionKind().GroupKind() != (schema.GroupKind{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"}) {
				t.Fatalf("kubetest: %s: %s %s is not a CustomResourceDefinition", path, obj.GetKind(), obj.GetName())
			}
			if _, err := e.Dynamic.Resource(crdGVR).Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: FieldManager, Force: true}); err != nil {
				t.Fatalf("kubetest: %s: install %s: %v", path, obj.GetName(), err)
			}
			if err := e.waitCRD(ctx, obj); err != nil {
				t.Fatalf("kubetest: %s: %s: %v", path, obj.GetName(), err)
			}
		}
	}
	e.mapper().Reset()
}

func (e *Env) waitCRD(ctx context.Context, crd *unstructured.Unstructured) error {
	group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "plural")
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	disco := e.Kube.Discovery()
	return wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		got, err := e.Dynamic.Resource(crdGVR).Get(ctx, crd.GetName(), metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		if !slices.ContainsFunc(conds, func(c any) bool {
			m, _ := c.(map[string]any)
			return m["type"] == "Established" && m["status"] == "True"
		}) {
			return false, nil
		}
		for _, v := range versions {
			m, _ := v.(map[string]any)
			if served, _ := m["served"].(bool); !served {
				continue
			}
			name, _ := m["name"].(string)
			if !servesResource(disco, group+"/"+name, plural) {
				return false, nil
			}
		}
		return true, nil
	})
}

func servesResource(disco discovery.DiscoveryInterface, groupVersion, plural string) bool {
	list, err := disco.ServerResourcesForGroupVersion(groupVersion)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == plural })
}

// Compact compacts etcd's history up to its current revision, as the API
// server's periodic compaction does, and returns that revision: a watch
// that resumes from an older resourceVersion straight from etcd gets
// 410 Gone.
func (e *Env) Compact(ctx context.Context) (int64, error) {
	var rangeResp struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	// etcd's JSON gateway: keys are base64; "AA==" is the key "\x00".
	if err := e.etcdPost(ctx, "/v3/kv/range", `{"key":"AA=="}`, &rangeResp); err != nil {
		return 0, err
	}
	rev, err := strconv.ParseInt(rangeResp.Header.Revision, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("etcd revision %q: %w", rangeResp.Header.Revision, err)
	}
	body := fmt.Sprintf(`{"revision":"%d","physical":true}`, rev)
	if err := e.etcdPost(ctx, "/v3/kv/compaction", body, nil); err != nil {
		return 0, err
	}
	return rev, nil
}

func (e *Env) etcdHealthy(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.EtcdURL+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(data), `"health":"true"`) {
		return fmt.Errorf("etcd /health: %s %s", resp.Status, data)
	}
	return nil
}

func (e *Env) etcdPost(ctx context.Context, path, body string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.EtcdURL+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %s %s", path, resp.Status, data)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}
