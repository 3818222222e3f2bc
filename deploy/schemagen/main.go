// Command schemagen writes the standalone, strict JSON schemas kubeconform
// needs to validate the chart offline: built-in kinds from the Kubernetes
// OpenAPI v2 document (api/openapi-spec/swagger.json of the k8s.io/kubernetes
// module) and custom resources from CRD YAML files. Files are named for
// kubeconform's -schema-location 'DIR/{{ .ResourceKind }}{{ .KindSuffix }}.json'.
//
//	go run ./deploy/schemagen -out DIR -swagger swagger.json \
//	    -kinds apps/v1/Deployment,v1/Service -crd a.yaml -crd b.yaml
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "schemagen:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("schemagen", flag.ContinueOnError)
	out := fs.String("out", "", "output directory (required)")
	swagger := fs.String("swagger", "", "Kubernetes OpenAPI v2 swagger.json")
	kinds := fs.String("kinds", "", "comma-separated group/version/Kind (core: v1/Kind) to take from -swagger")
	var crds listFlag
	fs.Var(&crds, "crd", "CRD YAML file (repeatable; multi-document files allowed)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("-out is required")
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return fmt.Errorf("cannot create %s: %w", *out, err)
	}
	var written []string
	if *swagger != "" {
		names, err := fromSwagger(*swagger, strings.Split(*kinds, ","), *out)
		if err != nil {
			return err
		}
		written = append(written, names...)
	}
	for _, path := range crds {
		names, err := fromCRD(path, *out)
		if err != nil {
			return err
		}
		written = append(written, names...)
	}
	sort.Strings(written)
	for _, n := range written {
		fmt.Fprintln(stdout, n)
	}
	return nil
}

// fileName follows kubeconform's ResourceKind and KindSuffix: the lower-case
// kind, the first label of the group, and the version.
func fileName(group, version, kind string) string {
	name := strings.ToLower(kind)
	if group != "" {
		name += "-" + strings.ToLower(strings.Split(group, ".")[0])
	}
	return name + "-" + strings.ToLower(version) + ".json"
}

func write(dir, name string, schema map[string]any) error {
	raw, err := json.Marshal(schema)
	if err != nil {
		return fmt.Errorf("cannot encode %s: %w", name, err)
	}
	return os.WriteFile(filepath.Join(dir, name), raw, 0o644)
}

func fromSwagger(path string, want []string, out string) ([]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read swagger: %w", err)
	}
	var doc struct {
		Definitions map[string]map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("cannot decode %s: %w", path, err)
	}
	// Index definitions by group/version/kind.
	byGVK := map[string]string{}
	for name, def := range doc.Definitions {
		gvks, _ := def["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			m, _ := g.(map[string]any)
			group, _ := m["group"].(string)
			version, _ := m["version"].(string)
			kind, _ := m["kind"].(string)
			key := version + "/" + kind
			if group != "" {
				key = group + "/" + key
			}
			byGVK[key] = name
		}
	}
	var written []string
	for _, w := range want {
		w = strings.TrimSpace(w)
		if w == "" {
			continue
		}
		def, ok := byGVK[w]
		if !ok {
			return nil, fmt.Errorf("%s: no definition for %s", path, w)
		}
		parts := strings.Split(w, "/")
		group, version, kind := "", parts[len(parts)-2], parts[len(parts)-1]
		if len(parts) == 3 {
			group = parts[0]
		}
		e := expander{defs: doc.Definitions, inProgress: map[string]bool{}}
		schema, err := e.ref(def)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", w, err)
		}
		name := fileName(group, version, kind)
		if err := write(out, name, schema); err != nil {
			return nil, err
		}
		written = append(written, name)
	}
	return written, nil
}

// expander inlines "#/definitions/..." references so each schema stands alone.
type expander struct {
	defs       map[string]map[string]any
	inProgress map[string]bool
}

func (e *expander) ref(name string) (map[string]any, error) {
	switch name {
	case "io.k8s.apimachinery.pkg.util.intstr.IntOrString":
		return map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}}, nil
	case "io.k8s.apimachinery.pkg.api.resource.Quantity":
		return map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}}}, nil
	}
	def, ok := e.defs[name]
	if !ok {
		return nil, fmt.Errorf("unknown definition %s", name)
	}
	if e.inProgress[name] {
		// A recursive type (JSONSchemaProps): accept anything below here.
		return map[string]any{}, nil
	}
	e.inProgress[name] = true
	defer delete(e.inProgress, name)
	return e.convert(def)
}

func (e *expander) convert(s map[string]any) (map[string]any, error) {
	if r, ok := s["$ref"].(string); ok {
		return e.ref(strings.TrimPrefix(r, "#/definitions/"))
	}
	out := map[string]any{}
	for k, v := range s {
		switch {
		case k == "properties":
			props := map[string]any{}
			for pk, pv := range v.(map[string]any) {
				c, err := e.convert(pv.(map[string]any))
				if err != nil {
					return nil, fmt.Errorf("%s: %w", pk, err)
				}
				props[pk] = c
			}
			out[k] = props
		case k == "items" || k == "additionalProperties":
			if m, ok := v.(map[string]any); ok {
				c, err := e.convert(m)
				if err != nil {
					return nil, err
				}
				out[k] = c
			} else {
				out[k] = v
			}
		case k == "allOf" || k == "anyOf" || k == "oneOf":
			var list []any
			for _, item := range v.([]any) {
				c, err := e.convert(item.(map[string]any))
				if err != nil {
					return nil, err
				}
				list = append(list, c)
			}
			out[k] = list
		case k == "format" || k == "description" || strings.HasPrefix(k, "x-kubernetes-"):
			// Annotations only; "int-or-string" and friends are not JSON Schema formats.
		default:
			out[k] = v
		}
	}
	return tighten(out, false), nil
}

// tighten makes a converted schema strict (no unknown fields where the
// properties are known) and lets typed values be null, as the API server does.
func tighten(s map[string]any, preserveUnknown bool) map[string]any {
	if _, ok := s["properties"]; ok && !preserveUnknown {
		if _, has := s["additionalProperties"]; !has {
			s["additionalProperties"] = false
		}
	}
	if t, ok := s["type"].(string); ok {
		s["type"] = []any{t, "null"}
	}
	return s
}

// convertCRD turns an OpenAPI v3 structural schema into JSON Schema.
func convertCRD(s map[string]any) map[string]any {
	out := map[string]any{}
	preserve, _ := s["x-kubernetes-preserve-unknown-fields"].(bool)
	for k, v := range s {
		switch k {
		case "properties":
			props := map[string]any{}
			for pk, pv := range v.(map[string]any) {
				props[pk] = convertCRD(pv.(map[string]any))
			}
			out[k] = props
		case "items", "additionalProperties", "not":
			if m, ok := v.(map[string]any); ok {
				out[k] = convertCRD(m)
			} else {
				out[k] = v
			}
		case "allOf", "anyOf", "oneOf":
			var list []any
			for _, item := range v.([]any) {
				list = append(list, convertCRD(item.(map[string]any)))
			}
			out[k] = list
		case "format", "description", "nullable", "example", "externalDocs":
		default:
			if !strings.HasPrefix(k, "x-kubernetes-") {
				out[k] = v
			}
		}
	}
	if ios, _ := s["x-kubernetes-int-or-string"].(bool); ios {
		delete(out, "type")
		out["anyOf"] = []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}
	}
	if nullable, _ := s["nullable"].(bool); nullable {
		if t, ok := out["type"].(string); ok {
			out["type"] = []any{t, "null"}
		}
	}
	if _, ok := out["properties"]; ok && !preserve {
		if _, has := out["additionalProperties"]; !has {
			out["additionalProperties"] = false
		}
	}
	return out
}

func fromCRD(path, out string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot open CRD: %w", err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	var written []string
	for {
		var crd struct {
			Kind string `yaml:"kind"`
			Spec struct {
				Group string `yaml:"group"`
				Names struct {
					Kind string `yaml:"kind"`
				} `yaml:"names"`
				Versions []struct {
					Name   string `yaml:"name"`
					Served bool   `yaml:"served"`
					Schema struct {
						OpenAPIV3Schema map[string]any `yaml:"openAPIV3Schema"`
					} `yaml:"schema"`
				} `yaml:"versions"`
			} `yaml:"spec"`
		}
		err := dec.Decode(&crd)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("cannot decode %s: %w", path, err)
		}
		if crd.Kind != "CustomResourceDefinition" {
			continue
		}
		for _, v := range crd.Spec.Versions {
			if !v.Served || v.Schema.OpenAPIV3Schema == nil {
				continue
			}
			name := fileName(crd.Spec.Group, v.Name, crd.Spec.Names.Kind)
			if err := write(out, name, convertCRD(v.Schema.OpenAPIV3Schema)); err != nil {
				return nil, err
			}
			written = append(written, name)
		}
	}
	if len(written) == 0 {
		return nil, fmt.Errorf("%s: no served CRD version with a schema", path)
	}
	return written, nil
}
