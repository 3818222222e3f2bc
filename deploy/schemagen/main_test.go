package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFileName(t *testing.T) {
	tests := []struct{ group, version, kind, want string }{
		{"", "v1", "Service", "service-v1.json"},
		{"apps", "v1", "Deployment", "deployment-apps-v1.json"},
		{"keda.sh", "v1alpha1", "ScaledObject", "scaledobject-keda-v1alpha1.json"},
		{"inference.networking.k8s.io", "v1", "InferencePool", "inferencepool-inference-v1.json"},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, fileName(tc.group, tc.version, tc.kind))
	}
}

func TestConvertCRD(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"known properties become strict",
			`{"type":"object","description":"d","properties":{"a":{"type":"string","format":"date-time"}}}`,
			`{"type":"object","additionalProperties":false,"properties":{"a":{"type":"string"}}}`},
		{"preserve-unknown-fields stays open",
			`{"type":"object","x-kubernetes-preserve-unknown-fields":true,"properties":{"a":{"type":"string"}}}`,
			`{"type":"object","properties":{"a":{"type":"string"}}}`},
		{"int-or-string",
			`{"x-kubernetes-int-or-string":true,"type":"string"}`,
			`{"anyOf":[{"type":"string"},{"type":"integer"}]}`},
		{"nullable",
			`{"type":"string","nullable":true}`,
			`{"type":["string","null"]}`},
		{"maps keep their value schema",
			`{"type":"object","additionalProperties":{"type":"string"}}`,
			`{"type":"object","additionalProperties":{"type":"string"}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var in map[string]any
			require.NoError(t, json.Unmarshal([]byte(tc.in), &in))
			got, err := json.Marshal(convertCRD(in))
			require.NoError(t, err)
			require.JSONEq(t, tc.want, string(got))
		})
	}
}

func TestSwaggerExpansion(t *testing.T) {
	dir := t.TempDir()
	swagger := filepath.Join(dir, "swagger.json")
	require.NoError(t, os.WriteFile(swagger, []byte(`{"definitions":{
		"io.k8s.api.apps.v1.Thing":{"type":"object","x-kubernetes-group-version-kind":[{"group":"apps","version":"v1","kind":"Thing"}],
			"properties":{"spec":{"$ref":"#/definitions/io.k8s.api.apps.v1.Spec"},"port":{"$ref":"#/definitions/io.k8s.apimachinery.pkg.util.intstr.IntOrString"}}},
		"io.k8s.api.apps.v1.Spec":{"type":"object","properties":{"self":{"$ref":"#/definitions/io.k8s.api.apps.v1.Spec"},"n":{"type":"integer","format":"int32"}}}
	}}`), 0o644))
	out := filepath.Join(dir, "out")
	require.NoError(t, os.Mkdir(out, 0o755))
	names, err := fromSwagger(swagger, []string{"apps/v1/Thing"}, out)
	require.NoError(t, err)
	require.Equal(t, []string{"thing-apps-v1.json"}, names)
	raw, err := os.ReadFile(filepath.Join(out, "thing-apps-v1.json"))
	require.NoError(t, err)
	require.JSONEq(t, `{"type":["object","null"],"additionalProperties":false,"properties":{
		"spec":{"type":["object","null"],"additionalProperties":false,"properties":{"self":{},"n":{"type":["integer","null"]}}},
		"port":{"oneOf":[{"type":"string"},{"type":"integer"}]}}}`, string(raw))

	_, err = fromSwagger(swagger, []string{"v1/Missing"}, out)
	require.ErrorContains(t, err, "no definition for v1/Missing")
}
