package discovery

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/rules"
)

// FuzzStaticFile checks that the endpoint file parser never panics and that
// whatever it accepts is a valid, sorted, duplicate-free set.
func FuzzStaticFile(f *testing.F) {
	f.Add([]byte("defaults: {model: m, kv_events_port: 5557}\nendpoints:\n  - {ip: 127.0.0.1, port: 8000}\n"))
	f.Add([]byte("endpoints:\n  - {ip: \"::1\", port: 8000, model: m, engine: sglang, replay_port: 5558, metrics_port: 0}\n"))
	f.Add([]byte("endpoints: []\n"))
	f.Add([]byte("endpoints:\n  - {ip: 127.0.0.1, port: 8000, model: m}\n  - {ip: 127.0.0.1, port: 8000, model: m}\n"))
	f.Add([]byte("defaults: {labels: {a: b}, metrics_path: /x}\nendpoints: [{ip: 127.0.0.1, port: 1, model: m, labels: {c: 1}}]\n"))
	f.Add([]byte("endpoints: &a [*a]\n"))
	f.Add([]byte("---\n---\n"))
	f.Add([]byte("endpoints:\n  - ip: 127.0.0.1\n    port: 0x1F40\n    model: !!binary bQ==\n"))
	if data, err := os.ReadFile(filepath.Join("..", "deploy", "config", "endpoints.example.yaml")); err == nil {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		eps, err := ParseFile(data)
		if err != nil {
			require.Nil(t, eps)
			require.NotEmpty(t, err.Error())
			return
		}
		seen := make(map[string]bool, len(eps))
		for i, ep := range eps {
			if i > 0 {
				require.Less(t, eps[i-1].Addr, ep.Addr)
			}
			require.False(t, seen[ep.Addr])
			seen[ep.Addr] = true
			_, _, err := net.SplitHostPort(ep.Addr)
			require.NoError(t, err)
			require.True(t, validEngine(ep.Engine))
			require.NotEmpty(t, ep.Model)
			for _, z := range []string{ep.KVEvents, ep.KVReplay} {
				require.True(t, z == "" || strings.HasPrefix(z, "tcp://"), z)
			}
		}
	})
}

// FuzzStaticFileRules checks that the endpoint file's rule sections never
// panic the parser and that whatever it accepts is valid, compiles in a
// store on its own, and answers every lookup within what it defines: a
// rewrite picks one of its rule's targets, a fallback is never the model
// itself.
func FuzzStaticFileRules(f *testing.F) {
	f.Add([]byte(rulesFile))
	f.Add([]byte("endpoints: []\nobjectives: [{name: o, priority: -2147483648}, {name: p}]\n"))
	f.Add([]byte("endpoints: []\nrewrites: [{name: r, rules: [{targets: [{modelRewrite: x, weight: 1000000}, {modelRewrite: y, weight: 1}]}]}]\n"))
	f.Add([]byte("endpoints: []\nrewrites: [{name: r, rules: [{matches: [{model: {value: m}}, {model: {type: Exact, value: n}}], targets: [{modelRewrite: m}]}]}]\n"))
	f.Add([]byte("endpoints: []\nmodels: [{name: a, aliases: [b], fallbacks: [c, d]}, {name: c, aliases: [e], fallbacks: [b]}]\n"))
	f.Add([]byte("endpoints: []\nmodels: &m [{name: a, fallbacks: *m}]\n"))
	f.Add([]byte("endpoints: []\nrewrites: [{name: r, rules: [{targets: []}]}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		spec, err := ParseFileRules(data)
		if err != nil {
			require.Nil(t, spec)
			require.NotEmpty(t, err.Error())
			return
		}
		if spec == nil {
			return
		}
		require.NoError(t, spec.Validate())
		store := rules.NewStore([]rules.Band{{Name: "hi", Priority: 10}, {Name: "lo", Priority: -10}}, "hi")
		require.NoError(t, store.Set("file", spec))
		tbl := store.Load()
		for _, o := range spec.Objectives {
			b, ok := tbl.Band(o.Name)
			require.True(t, ok)
			require.Contains(t, []string{"hi", "lo"}, b)
		}
		targets := map[string]bool{}
		for _, rw := range spec.Rewrites {
			for _, r := range rw.Rules {
				for _, tg := range r.Targets {
					targets[tg.ModelRewrite] = true
				}
			}
		}
		for _, rw := range spec.Rewrites {
			for _, r := range rw.Rules {
				for _, m := range r.Matches {
					target, _, ok := tbl.Rewrite(m.Model.Value)
					require.True(t, ok, "a model a rule matches is rewritten")
					require.True(t, targets[target], target)
				}
			}
		}
		for _, m := range spec.Models {
			for _, a := range m.Aliases {
				require.Equal(t, m.Name, tbl.Canonical(a))
			}
			for _, fb := range tbl.Fallbacks(m.Name) {
				require.NotEqual(t, m.Name, fb)
			}
		}
	})
}
