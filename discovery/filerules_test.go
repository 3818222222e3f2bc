package discovery

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/rules"
)

const rulesFile = `endpoints:
  - {ip: 10.0.1.10, port: 8000, model: llama-3.3-70b}
  - {ip: 10.0.1.11, port: 8000, model: qwen2.5-32b}
objectives:
  - {name: interactive, priority: 300}
  - {name: batch, priority: 100}
  - {name: standard}
rewrites:
  - name: llama-canary
    rules:
      - matches: [{model: {type: Exact, value: llama-3.3-70b}}]
        targets:
          - {modelRewrite: llama-3.3-70b-v2, weight: 10}
          - {modelRewrite: llama-3.3-70b, weight: 90}
      - targets: [{modelRewrite: qwen2.5-32b}]
models:
  - name: llama-3.3-70b
    aliases: [llama]
    fallbacks: [qwen2.5-32b]
  - {name: qwen2.5-32b, aliases: [qwen]}
`

func p32(v int32) *int32 { return &v }

func TestParseFileRules(t *testing.T) {
	spec, err := ParseFileRules([]byte(rulesFile))
	require.NoError(t, err)
	require.Equal(t, &rules.Spec{
		Objectives: []rules.Objective{{Name: "interactive", Priority: p32(300)}, {Name: "batch", Priority: p32(100)}, {Name: "standard"}},
		Rewrites: []rules.Rewrite{{Name: "llama-canary", Rules: []rules.Rule{
			{
				Matches: []rules.Match{{Model: &rules.ModelMatch{Type: "Exact", Value: "llama-3.3-70b"}}},
				Targets: []rules.Target{{ModelRewrite: "llama-3.3-70b-v2", Weight: p32(10)}, {ModelRewrite: "llama-3.3-70b", Weight: p32(90)}},
			},
			{Targets: []rules.Target{{ModelRewrite: "qwen2.5-32b"}}},
		}}},
		Models: []rules.Model{
			{Name: "llama-3.3-70b", Aliases: []string{"llama"}, Fallbacks: []string{"qwen2.5-32b"}},
			{Name: "qwen2.5-32b", Aliases: []string{"qwen"}},
		},
	}, spec)

	spec, err = ParseFileRules([]byte("endpoints: []\n"))
	require.NoError(t, err)
	require.Nil(t, spec, "no rules sections: no rules")

	const ep = "endpoints: []\n"
	bad := []struct{ name, file, err string }{
		{"unknown rule field", ep + "rewrites: [{name: r, rules: [{targets: [{model: x}]}]}]\n", "field model not found"},
		{"snake_case target", ep + "rewrites: [{name: r, rules: [{targets: [{model_rewrite: x}]}]}]\n", "field model_rewrite not found"},
		{"rule without targets", ep + "rewrites: [{name: r, rules: [{matches: [{model: {value: m}}]}]}]\n", "rewrites[0] (r): rules[0]: no targets"},
		{"priority out of int32", ep + "objectives: [{name: o, priority: 4294967296}]\n", "cannot unmarshal"},
		{"weight as a string", ep + "rewrites: [{name: r, rules: [{targets: [{modelRewrite: x, weight: ten}]}]}]\n", "cannot unmarshal"},
		{"alias claimed twice", ep + "models: [{name: a, aliases: [x]}, {name: b, aliases: [x]}]\n", `"x" is already an alias of a`},
		{"objectives not a list", ep + "objectives: {name: o}\n", "cannot unmarshal"},
	}
	for _, tt := range bad {
		_, err := ParseFileRules([]byte(tt.file))
		require.ErrorContains(t, err, tt.err, tt.name)
		_, err = ParseFile([]byte(tt.file))
		require.Error(t, err, "%s: a file with bad rules is a bad file", tt.name)
	}
}

// TestFileRulesReload: the file's rules reach the store at start and on
// every valid edit; a bad edit keeps the last good rules and endpoints;
// rules that clash with another source's are refused while the file's
// endpoints still apply.
func TestFileRulesReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	writeAtomic(t, path, rulesFile)
	store := rules.NewStore([]rules.Band{{Name: "gold", Priority: 300}, {Name: "bronze", Priority: 100}}, "gold")
	u, logs := runFile(t, FileConfig{Path: path, Rules: store})
	u.waitFor(t, "initial set", func(eps []endpoint.Endpoint) bool { return len(eps) == 2 })
	band := func(o string) string { b, _ := store.Load().Band(o); return b }
	require.Equal(t, "bronze", band("batch"))
	require.Equal(t, "llama-3.3-70b", store.Load().Canonical("llama"))

	// A rules-only edit applies without an endpoint update.
	writeAtomic(t, path, rulesFile+"  - {name: mistral, aliases: [mis]}\n")
	require.Eventually(t, func() bool { return store.Load().Canonical("mis") == "mistral" }, 10*time.Second, 5*time.Millisecond)
	require.Len(t, u.all(), 1)

	// A bad rule keeps everything.
	before := store.Load()
	writeAtomic(t, path, "endpoints: [{ip: 10.0.1.12, port: 8000, model: m}]\nobjectives: [{priority: 1}]\n")
	require.Eventually(t, func() bool {
		return logs.FilterMessage("endpoint file invalid, keeping the last good set").Len() == 1
	}, 10*time.Second, 5*time.Millisecond)
	require.Same(t, before, store.Load())
	require.Len(t, u.all(), 1)

	// Rules that clash with the config's: endpoints apply, rules stay.
	require.NoError(t, store.Set("config", &rules.Spec{Models: []rules.Model{{Name: "other", Aliases: []string{"o"}}}}))
	before = store.Load()
	writeAtomic(t, path, "endpoints: [{ip: 10.0.1.12, port: 8000, model: m}]\nmodels: [{name: m, aliases: [o]}]\n")
	u.waitFor(t, "endpoint of the clashing edit", func(eps []endpoint.Endpoint) bool { return len(eps) == 1 && eps[0].Addr == "10.0.1.12:8000" })
	require.Equal(t, 1, logs.FilterMessage("endpoint file rules refused, keeping the last good rules").Len())
	require.Same(t, before, store.Load())
	require.Equal(t, "bronze", band("batch"), "the file's last good rules are still in force")

	// Removing the rules sections removes the file's rules.
	writeAtomic(t, path, "endpoints: [{ip: 10.0.1.13, port: 8000, model: m}]\n")
	u.waitFor(t, "rules removed", func(eps []endpoint.Endpoint) bool { return len(eps) == 1 && eps[0].Addr == "10.0.1.13:8000" })
	require.Empty(t, band("batch"))
	require.Equal(t, "other", store.Load().Canonical("o"), "the config's rules stay")
}

func TestFileRulesClashAtStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	writeAtomic(t, path, rulesFile)
	store := rules.NewStore(nil, "gold")
	require.NoError(t, store.Set("config", &rules.Spec{Models: []rules.Model{{Name: "llama"}}}))
	src, err := NewFile(FileConfig{Path: path, Rules: store}, nil)
	require.NoError(t, err)
	err = src.Run(context.Background(), func([]endpoint.Endpoint) { t.Fatal("no update for a file whose rules are refused at start") })
	require.ErrorContains(t, err, `"llama" is already the name of models[0]`)
}

// TestExampleFileRules: the example file's rule sections apply as its
// comments say.
func TestExampleFileRules(t *testing.T) {
	data, err := readLimited(filepath.Join("..", "deploy", "config", "endpoints.example.yaml"))
	require.NoError(t, err)
	spec, err := ParseFileRules(data)
	require.NoError(t, err)
	store := rules.NewStore([]rules.Band{{Name: "platinum", Priority: 400}, {Name: "gold", Priority: 300}, {Name: "silver", Priority: 200}, {Name: "bronze", Priority: 100}}, "gold")
	require.NoError(t, store.Set("file", spec))
	tbl := store.Load()
	b, _ := tbl.Band("batch")
	require.Equal(t, "bronze", b)
	target, _, _ := tbl.Rewrite("meta-llama/Llama-3-8B-Instruct")
	require.Equal(t, "meta-llama/Llama-3.1-8B-Instruct", target)
	require.Equal(t, "Qwen/Qwen3-32B", tbl.Canonical("qwen"))
	require.Equal(t, []string{"Qwen/Qwen3-32B"}, tbl.Fallbacks(tbl.Canonical("llama")))
}
