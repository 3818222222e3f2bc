package discovery

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/omnious/provider-node/rules"
)

// object decodes one object as the API server sends it (JSON numbers are
// int64 in unstructured data, as the dynamic client decodes them).
func object(t *testing.T, js string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	require.NoError(t, u.UnmarshalJSON([]byte(js)))
	return u
}

func objectiveJSON(name, spec string) string {
	return `{"apiVersion":"llm-d.ai/v1alpha2","kind":"InferenceObjective","metadata":{"name":"` + name +
		`","namespace":"serving","resourceVersion":"1"},"spec":` + spec + `}`
}

func rewriteJSON(name, created, spec string) string {
	return `{"apiVersion":"llm-d.ai/v1alpha2","kind":"InferenceModelRewrite","metadata":{"name":"` + name +
		`","namespace":"serving","resourceVersion":"1","creationTimestamp":"` + created + `"},"spec":` + spec + `}`
}

const ref = `"poolRef":{"group":"inference.networking.k8s.io","kind":"InferencePool","name":"pool"}`

func TestObjectiveOf(t *testing.T) {
	tests := []struct {
		name, spec string
		want       rules.Objective
		ours       bool
		err        string
	}{
		{"priority", `{"priority":10,` + ref + `}`, rules.Objective{Name: "o", Priority: p32(10)}, true, ""},
		{"negative priority", `{"priority":-5,` + ref + `}`, rules.Objective{Name: "o", Priority: p32(-5)}, true, ""},
		{"no priority", `{` + ref + `}`, rules.Objective{Name: "o"}, true, ""},
		{"group left empty", `{"priority":1,"poolRef":{"name":"pool"}}`, rules.Objective{Name: "o", Priority: p32(1)}, true, ""},
		{"another pool", `{"priority":1,"poolRef":{"name":"other"}}`, rules.Objective{}, false, ""},
		{"another group", `{"priority":1,"poolRef":{"group":"inference.networking.x-k8s.io","name":"pool"}}`, rules.Objective{}, false, ""},
		{"priority as a string", `{"priority":"high",` + ref + `}`, rules.Objective{}, true, "cannot unmarshal string"},
		{"priority past int32", `{"priority":4294967296,` + ref + `}`, rules.Objective{}, true, "cannot unmarshal number 4294967296"},
	}
	for _, tt := range tests {
		got, ours, err := objectiveOf(object(t, objectiveJSON("o", tt.spec)), "pool")
		checkConverted(t, tt.name, tt.want, tt.ours, tt.err, got, ours, err)
	}
	_, ours, err := objectiveOf(object(t, `{"apiVersion":"llm-d.ai/v1alpha2","kind":"InferenceObjective","metadata":{"name":"o"}}`), "pool")
	require.True(t, ours)
	require.ErrorContains(t, err, "no spec")
}

func TestRewriteOf(t *testing.T) {
	const created = "2026-01-02T03:04:05Z"
	tests := []struct {
		name, spec string
		want       []rules.Rule
		ours       bool
		err        string
	}{
		{"weighted targets", `{` + ref + `,"rules":[{"matches":[{"model":{"type":"Exact","value":"llama"}}],"targets":[{"modelRewrite":"llama-v2","weight":10},{"modelRewrite":"llama-v1","weight":90}]}]}`,
			[]rules.Rule{{Matches: []rules.Match{{Model: &rules.ModelMatch{Type: "Exact", Value: "llama"}}},
				Targets: []rules.Target{{ModelRewrite: "llama-v2", Weight: p32(10)}, {ModelRewrite: "llama-v1", Weight: p32(90)}}}}, true, ""},
		{"generic rule", `{` + ref + `,"rules":[{"targets":[{"modelRewrite":"x"}]}]}`,
			[]rules.Rule{{Targets: []rules.Target{{ModelRewrite: "x"}}}}, true, ""},
		{"no rules", `{` + ref + `,"rules":[]}`, []rules.Rule{}, true, ""},
		{"no poolRef", `{"rules":[]}`, nil, false, ""},
		{"another pool", `{"poolRef":{"name":"other"},"rules":[]}`, nil, false, ""},
		{"mixed weights", `{` + ref + `,"rules":[{"targets":[{"modelRewrite":"a","weight":1},{"modelRewrite":"b"}]}]}`, nil, true, "1 of 2 targets have a weight"},
		{"rule without targets", `{` + ref + `,"rules":[{"matches":[{"model":{"value":"m"}}]}]}`, nil, true, "rules[0]: no targets"},
		{"empty modelRewrite", `{` + ref + `,"rules":[{"targets":[{"modelRewrite":""}]}]}`, nil, true, "targets[0].modelRewrite is empty"},
		{"weight as a string", `{` + ref + `,"rules":[{"targets":[{"modelRewrite":"a","weight":"10"}]}]}`, nil, true, "cannot unmarshal string"},
		{"rules not a list", `{` + ref + `,"rules":{"targets":[]}}`, nil, true, "cannot unmarshal object"},
	}
	for _, tt := range tests {
		got, ours, err := rewriteOf(object(t, rewriteJSON("rw", created, tt.spec)), "pool")
		want := rules.Rewrite{Name: "rw", Rules: tt.want, Created: must(time.Parse(time.RFC3339, created)).Local()}
		checkConverted(t, tt.name, want, tt.ours, tt.err, got, ours, err)
	}
}

// checkConverted compares one conversion's result with a table row: an
// error containing wantErr, or none and, for the pool's objects, want.
func checkConverted[T any](t *testing.T, name string, want T, wantOurs bool, wantErr string, got T, ours bool, err error) {
	t.Helper()
	require.Equal(t, wantOurs, ours, name)
	if wantErr != "" {
		require.ErrorContains(t, err, wantErr, name)
		return
	}
	require.NoError(t, err, name)
	if ours {
		require.Equal(t, want, got, name)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// ruleEnv is a ruleWatch over client-go caches the test fills itself, as
// its informers would.
type ruleEnv struct {
	w         *ruleWatch
	store     *rules.Store
	objs, rws cache.Store
	logs      *observer.ObservedLogs
}

func newRuleEnv(t *testing.T) *ruleEnv {
	core, logs := observer.New(zap.InfoLevel)
	store := rules.NewStore([]rules.Band{{Name: "high", Priority: 10}, {Name: "std", Priority: 0}}, "std")
	p, err := NewPool(PoolConfig{Name: "pool", Namespace: "serving", Rules: store}, nil, nil, zap.New(core))
	require.NoError(t, err)
	e := &ruleEnv{w: newRuleWatch(p), store: store, logs: logs,
		objs: cache.NewStore(cache.MetaNamespaceKeyFunc), rws: cache.NewStore(cache.MetaNamespaceKeyFunc)}
	e.w.objStore, e.w.rwStore = e.objs, e.rws
	return e
}

func (e *ruleEnv) put(t *testing.T, s cache.Store, js string) {
	t.Helper()
	require.NoError(t, s.Update(object(t, js)))
	e.w.publish()
}

func (e *ruleEnv) band(o string) string {
	b, _ := e.store.Load().Band(o)
	return b
}

// TestRuleWatchKeepsLastGood: an object updated to an invalid version keeps
// its last good version, logged once however often it is seen; one that
// was never valid is ignored; deleting or moving an object to another pool
// removes its rules.
func TestRuleWatchKeepsLastGood(t *testing.T) {
	e := newRuleEnv(t)
	e.put(t, e.objs, objectiveJSON("premium", `{"priority":10,`+ref+`}`))
	e.put(t, e.rws, rewriteJSON("canary", "2026-01-01T00:00:00Z", `{`+ref+`,"rules":[{"matches":[{"model":{"value":"m"}}],"targets":[{"modelRewrite":"m-v2"}]}]}`))
	require.Equal(t, "high", e.band("premium"))
	target, _, _ := e.store.Load().Rewrite("m")
	require.Equal(t, "m-v2", target)

	invalid := func() int { return e.logs.FilterMessageSnippet("invalid inferencemodelrewrite").Len() }
	e.put(t, e.rws, rewriteJSON("canary", "2026-01-01T00:00:00Z", `{`+ref+`,"rules":[{"targets":[]}]}`))
	e.w.publish()
	e.w.publish()
	require.Equal(t, 1, invalid(), "logged once")
	require.Equal(t, 1, e.logs.FilterMessage("invalid inferencemodelrewrite ignored, its last good version stays").Len())
	target, _, _ = e.store.Load().Rewrite("m")
	require.Equal(t, "m-v2", target, "the last good version stays")

	e.put(t, e.rws, rewriteJSON("broken", "2026-01-02T00:00:00Z", `{`+ref+`,"rules":[{"targets":[{"modelRewrite":"a","weight":0}]}]}`))
	require.Equal(t, 1, e.logs.FilterMessage("invalid inferencemodelrewrite ignored").Len(), "never valid: ignored")
	require.Equal(t, 1, len(e.w.last.Rewrites))

	// A new invalid version with another problem is logged again.
	e.put(t, e.rws, rewriteJSON("canary", "2026-01-01T00:00:00Z", `{`+ref+`,"rules":[{"targets":[{"modelRewrite":""}]}]}`))
	require.Equal(t, 3, invalid())
	// Valid again: applied, and a later problem is news again.
	e.put(t, e.rws, rewriteJSON("canary", "2026-01-01T00:00:00Z", `{`+ref+`,"rules":[{"matches":[{"model":{"value":"m"}}],"targets":[{"modelRewrite":"m-v3"}]}]}`))
	target, _, _ = e.store.Load().Rewrite("m")
	require.Equal(t, "m-v3", target)

	// Moved to another pool, then deleted: gone.
	e.put(t, e.objs, objectiveJSON("premium", `{"priority":10,"poolRef":{"name":"other"}}`))
	require.Empty(t, e.band("premium"))
	require.Empty(t, e.w.objectives)
	u := object(t, rewriteJSON("canary", "2026-01-01T00:00:00Z", `{}`))
	require.NoError(t, e.rws.Delete(u))
	e.w.publish()
	_, _, ok := e.store.Load().Rewrite("m")
	require.False(t, ok)
	require.NotContains(t, e.w.rewrites, "canary")
}

// TestRuleWatchPrecedence: across objects the oldest exact match wins, as
// llm-d-router orders them; equal timestamps go by name.
func TestRuleWatchPrecedence(t *testing.T) {
	e := newRuleEnv(t)
	rule := func(target string) string {
		return `{` + ref + `,"rules":[{"matches":[{"model":{"value":"m"}}],"targets":[{"modelRewrite":"` + target + `"}]}]}`
	}
	e.put(t, e.rws, rewriteJSON("a-newer", "2026-02-01T00:00:00Z", rule("newer")))
	e.put(t, e.rws, rewriteJSON("z-older", "2026-01-01T00:00:00Z", rule("older")))
	target, rw, _ := e.store.Load().Rewrite("m")
	require.Equal(t, "older", target)
	require.Equal(t, "z-older", rw)
	e.put(t, e.rws, rewriteJSON("b-same", "2026-01-01T00:00:00Z", rule("same")))
	target, _, _ = e.store.Load().Rewrite("m")
	require.Equal(t, "same", target, "same creation time: the first name")
}

// TestRuleWatchNoCRDs: with neither kind installed the source publishes
// empty rules, which leave the other sources' in force.
func TestRuleWatchNoCRDs(t *testing.T) {
	e := newRuleEnv(t)
	e.w.objStore, e.w.rwStore = nil, nil
	require.NoError(t, e.store.Set("config", &rules.Spec{Models: []rules.Model{{Name: "m", Aliases: []string{"a"}}}}))
	e.w.publish()
	require.True(t, e.w.set)
	require.Equal(t, "m", e.store.Load().Canonical("a"))
}
