package rules

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func p32(v int32) *int32 { return &v }

// llmgwBands are the llmgw router's default bands.
var llmgwBands = []Band{{"platinum", 400}, {"gold", 300}, {"silver", 200}, {"bronze", 100}}

func exact(models ...string) []Match {
	m := make([]Match, len(models))
	for i, v := range models {
		m[i] = Match{Model: &ModelMatch{Value: v}}
	}
	return m
}

func to(models ...string) []Target {
	t := make([]Target, len(models))
	for i, v := range models {
		t[i] = Target{ModelRewrite: v}
	}
	return t
}

func mustTable(t *testing.T, s *Spec) *Table {
	t.Helper()
	st := NewStore(llmgwBands, "gold")
	require.NoError(t, st.Set("test", s))
	return st.Load()
}

func TestObjectiveBand(t *testing.T) {
	tests := []struct {
		name     string
		priority *int32
		want     string
	}{
		{"exact band priority", p32(300), "gold"},
		{"between two bands: the lower", p32(350), "gold"},
		{"above every band: the highest", p32(1000), "platinum"},
		{"below every band: the lowest", p32(-10), "bronze"},
		{"zero with bands above it: the lowest", p32(0), "bronze"},
		{"unset: the default band", nil, "gold"},
	}
	for _, tt := range tests {
		tbl := mustTable(t, &Spec{Objectives: []Objective{{Name: "o", Priority: tt.priority}}})
		got, ok := tbl.Band("o")
		require.True(t, ok, tt.name)
		require.Equal(t, tt.want, got, tt.name)
	}
	tbl := mustTable(t, &Spec{Objectives: []Objective{{Name: "o", Priority: p32(1)}}})
	_, ok := tbl.Band("other")
	require.False(t, ok, "an unknown objective is no objective")
	// Bands on the objectives' own scale, as llm-d's examples use.
	st := NewStore([]Band{{"high", 10}, {"std", 0}, {"shed", -10}}, "std")
	require.NoError(t, st.Set("test", &Spec{Objectives: []Objective{{Name: "a", Priority: p32(5)}, {Name: "b", Priority: p32(-1)}, {Name: "c"}}}))
	for o, want := range map[string]string{"a": "std", "b": "shed", "c": "std"} {
		got, _ := st.Load().Band(o)
		require.Equal(t, want, got, o)
	}
}

func TestRewritePrecedence(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	spec := &Spec{Rewrites: []Rewrite{
		{Name: "newer", Created: t0.Add(time.Hour), Rules: []Rule{
			{Matches: exact("llama"), Targets: to("from-newer")},
		}},
		{Name: "older", Created: t0, Rules: []Rule{
			{Matches: exact("qwen"), Targets: to("qwen-first")},
			{Matches: exact("qwen", "llama"), Targets: to("from-older")},
			{Targets: to("generic-older")},
		}},
		{Name: "generic-newer", Created: t0.Add(2 * time.Hour), Rules: []Rule{{Targets: to("generic-newer")}}},
	}}
	tbl := mustTable(t, spec)
	tests := []struct{ model, target, rewrite string }{
		{"llama", "from-older", "older"},      // oldest exact match wins over a newer one
		{"qwen", "qwen-first", "older"},       // within a rewrite, the first rule
		{"mistral", "generic-older", "older"}, // no exact match: the oldest generic rule
	}
	for _, tt := range tests {
		target, rewrite, ok := tbl.Rewrite(tt.model)
		require.True(t, ok, tt.model)
		require.Equal(t, tt.target, target, tt.model)
		require.Equal(t, tt.rewrite, rewrite, tt.model)
	}

	// Equal timestamps (a file's entries): list order decides.
	tbl = mustTable(t, &Spec{Rewrites: []Rewrite{
		{Name: "a", Rules: []Rule{{Matches: exact("m"), Targets: to("a")}}},
		{Name: "b", Rules: []Rule{{Matches: exact("m"), Targets: to("b")}}},
	}})
	target, _, _ := tbl.Rewrite("m")
	require.Equal(t, "a", target)
	_, _, ok := tbl.Rewrite("other")
	require.False(t, ok, "no generic rule: other models are not rewritten")
}

func TestRewriteWeights(t *testing.T) {
	const n = 200_000
	share := func(targets []Target) map[string]float64 {
		tbl := mustTable(t, &Spec{Rewrites: []Rewrite{{Name: "split", Rules: []Rule{{Matches: exact("m"), Targets: targets}}}}})
		counts := map[string]float64{}
		for range n {
			target, _, ok := tbl.Rewrite("m")
			require.True(t, ok)
			counts[target]++
		}
		for k := range counts {
			counts[k] /= n
		}
		return counts
	}
	// The standard deviation of a share near 0.1 over 200k draws is under
	// 0.001: a 0.01 tolerance cannot fail by chance.
	got := share([]Target{{"canary", p32(10)}, {"stable", p32(90)}})
	require.InDelta(t, 0.10, got["canary"], 0.01)
	require.InDelta(t, 0.90, got["stable"], 0.01)
	got = share([]Target{{"a", p32(1)}, {"b", p32(1_000_000)}})
	require.InDelta(t, 1.0, got["b"], 0.001)
	got = share(to("x", "y", "z"))
	for _, m := range []string{"x", "y", "z"} {
		require.InDelta(t, 1.0/3, got[m], 0.01, "no weights: equal shares")
	}
	require.Equal(t, map[string]float64{"only": 1}, share(to("only")))
}

func TestAliasesAndFallbacks(t *testing.T) {
	tbl := mustTable(t, &Spec{Models: []Model{
		{Name: "llama-3.3-70b", Aliases: []string{"llama"}, Fallbacks: []string{"qwen", "mistral"}},
		{Name: "qwen2.5-32b", Aliases: []string{"qwen"}},
	}})
	require.Equal(t, "llama-3.3-70b", tbl.Canonical("llama"))
	require.Equal(t, "qwen2.5-32b", tbl.Canonical("qwen"))
	require.Equal(t, "other", tbl.Canonical("other"))
	require.Equal(t, []string{"qwen2.5-32b", "mistral"}, tbl.Fallbacks("llama-3.3-70b"), "fallbacks named by alias resolve")
	require.Nil(t, tbl.Fallbacks("qwen2.5-32b"))
	require.Nil(t, tbl.Fallbacks("llama"), "fallbacks belong to the model's name, resolved first")
	require.Equal(t, []string{"llama", "llama-3.3-70b", "mistral", "qwen", "qwen2.5-32b"}, tbl.Models())
}

func TestNilTable(t *testing.T) {
	var tbl *Table
	_, ok := tbl.Band("o")
	require.False(t, ok)
	_, _, ok = tbl.Rewrite("m")
	require.False(t, ok)
	require.Equal(t, "m", tbl.Canonical("m"))
	require.Nil(t, tbl.Fallbacks("m"))
	require.Nil(t, NewStore(nil, "").Load(), "no rules: no table")
	st := NewStore(nil, "")
	require.NoError(t, st.Set("x", &Spec{Objectives: []Objective{}}))
	require.Nil(t, st.Load(), "an empty spec compiles to no table")
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		spec Spec
		err  string // "" = valid
	}{
		{"valid", Spec{
			Objectives: []Objective{{Name: "a", Priority: p32(1)}},
			Rewrites:   []Rewrite{{Name: "r", Rules: []Rule{{Matches: exact("m"), Targets: []Target{{"x", p32(1)}, {"y", p32(3)}}}}}},
			Models:     []Model{{Name: "m", Aliases: []string{"mm"}, Fallbacks: []string{"n"}}},
		}, ""},
		{"rewrite without rules does nothing", Spec{Rewrites: []Rewrite{{Name: "r"}}}, ""},
		{"objective without name", Spec{Objectives: []Objective{{}}}, "objectives[0]: name is empty"},
		{"duplicate objective", Spec{Objectives: []Objective{{Name: "a"}, {Name: "a"}}}, `objectives[1]: name "a" already used by objectives[0]`},
		{"rule without targets", Spec{Rewrites: []Rewrite{{Name: "r", Rules: []Rule{{Matches: exact("m")}}}}}, "rewrites[0] (r): rules[0]: no targets"},
		{"empty target model", Spec{Rewrites: []Rewrite{{Name: "r", Rules: []Rule{{Targets: to("")}}}}}, "targets[0].modelRewrite is empty"},
		{"mixed weights", Spec{Rewrites: []Rewrite{{Name: "r", Rules: []Rule{{Targets: []Target{{"x", p32(1)}, {"y", nil}}}}}}}, "1 of 2 targets have a weight"},
		{"zero weight", Spec{Rewrites: []Rewrite{{Name: "r", Rules: []Rule{{Targets: []Target{{"x", p32(0)}}}}}}}, "targets[0].weight 0: want 1..1000000"},
		{"weight too large", Spec{Rewrites: []Rewrite{{Name: "r", Rules: []Rule{{Targets: []Target{{"x", p32(MaxWeight + 1)}}}}}}}, "want 1..1000000"},
		{"match without model", Spec{Rewrites: []Rewrite{{Name: "r", Rules: []Rule{{Matches: []Match{{}}, Targets: to("x")}}}}}, "matches[0]: no model"},
		{"match type", Spec{Rewrites: []Rewrite{{Name: "r", Rules: []Rule{{Matches: []Match{{Model: &ModelMatch{Type: "Prefix", Value: "m"}}}, Targets: to("x")}}}}}, `matches[0].model.type "Prefix": want Exact`},
		{"empty match value", Spec{Rewrites: []Rewrite{{Name: "r", Rules: []Rule{{Matches: exact(""), Targets: to("x")}}}}}, "matches[0].model.value is empty"},
		{"duplicate rewrite", Spec{Rewrites: []Rewrite{{Name: "r"}, {Name: "r"}}}, `rewrites[1]: name "r" already used`},
		{"alias is the name", Spec{Models: []Model{{Name: "m", Aliases: []string{"m"}}}}, `aliases[0] "m" repeats the name`},
		{"fallback to itself", Spec{Models: []Model{{Name: "m", Fallbacks: []string{"m"}}}}, `fallbacks[0] "m" names the model itself`},
		{"alias of two models", Spec{Models: []Model{{Name: "a", Aliases: []string{"x"}}, {Name: "b", Aliases: []string{"x"}}}}, `models[1] (b) alias "x": "x" is already an alias of a`},
		{"alias is another model", Spec{Models: []Model{{Name: "a"}, {Name: "b", Aliases: []string{"a"}}}}, `"a" is already the name of models[0]`},
		{"model listed twice", Spec{Models: []Model{{Name: "a"}, {Name: "a"}}}, `models[1] (a): "a" is already the name of models[0]`},
		{"space around a name", Spec{Models: []Model{{Name: " a"}}}, "leading or trailing space"},
	}
	for _, tt := range tests {
		err := tt.spec.Validate()
		if tt.err == "" {
			require.NoError(t, err, tt.name)
			continue
		}
		require.ErrorContains(t, err, tt.err, tt.name)
	}
}

// TestStoreKeepsLastGood: a refused spec (invalid alone, or conflicting
// with another source's) leaves the rules in force unchanged.
func TestStoreKeepsLastGood(t *testing.T) {
	st := NewStore(llmgwBands, "gold")
	good := &Spec{Objectives: []Objective{{Name: "batch", Priority: p32(100)}}, Models: []Model{{Name: "m", Aliases: []string{"a"}}}}
	require.NoError(t, st.Set("file", good))
	before := st.Load()
	require.ErrorContains(t, st.Set("file", &Spec{Objectives: []Objective{{}}}), "file rules: objectives[0]: name is empty")
	require.Same(t, before, st.Load())

	err := st.Set("config", &Spec{Models: []Model{{Name: "n", Aliases: []string{"a"}}}})
	require.ErrorContains(t, err, "config rules conflict with those of [config file]")
	require.ErrorContains(t, err, `"a" is already an alias of n`)
	require.Same(t, before, st.Load())

	require.NoError(t, st.Set("config", &Spec{Models: []Model{{Name: "n", Fallbacks: []string{"a"}}}}))
	tbl := st.Load()
	require.Equal(t, []string{"m"}, tbl.Fallbacks("n"), "one source's fallback resolves another's alias")
	b, _ := tbl.Band("batch")
	require.Equal(t, "bronze", b)

	require.NoError(t, st.Set("file", nil))
	_, ok := st.Load().Band("batch")
	require.False(t, ok, "a nil spec removes the source's rules")
	require.NoError(t, st.Set("config", &Spec{}))
	require.Nil(t, st.Load())
}
