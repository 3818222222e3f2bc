// Package discovery owns the list of serving endpoints the EPP routes to.
// It has two sources that share one small interface:
//
//   - File: a static YAML endpoint file for bare metal and sidecar setups,
//     polled for content changes and hot-reloaded (a bad edit keeps the last
//     good set);
//   - Pool: a Kubernetes InferencePool (inference.networking.k8s.io/v1) and
//     the ready Pods its selector matches, watched through client-go
//     informers; every target port of every ready Pod is one endpoint.
//
// Both hand the full current set to a callback, sorted by Addr, once at
// start and again whenever it changes. The package never talks to the
// engines themselves: it only says where they are.
package discovery

import (
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/omnious/provider-node/endpoint"
)

// Source produces the current endpoint set.
//
// Run calls update with the full set (sorted by Addr) once when it is first
// known and again whenever it changes; update is never called concurrently
// and the slice handed to it is never modified afterwards, so the callee may
// keep it. Run returns nil when ctx is done, or an error if the source
// cannot start at all.
type Source interface {
	Run(ctx context.Context, update func([]endpoint.Endpoint)) error
}

// Engine names accepted in Endpoint.Engine.
const (
	EngineVLLM   = "vllm"
	EngineSGLang = "sglang"
)

func validEngine(e string) bool { return e == EngineVLLM || e == EngineSGLang }

// sortEndpoints orders by Addr so every source is deterministic.
func sortEndpoints(eps []endpoint.Endpoint) {
	slices.SortFunc(eps, func(a, b endpoint.Endpoint) int { return strings.Compare(a.Addr, b.Addr) })
}

// equalEndpoints reports whether two sorted sets are the same; it decides
// whether an update is worth sending. A nil and an empty Labels map are
// equal.
func equalEndpoints(a, b []endpoint.Endpoint) bool {
	return slices.EqualFunc(a, b, func(x, y endpoint.Endpoint) bool {
		return x.Addr == y.Addr && x.Model == y.Model && x.Engine == y.Engine &&
			x.MetricsURL == y.MetricsURL && x.KVEvents == y.KVEvents &&
			x.KVReplay == y.KVReplay && x.KVConnect == y.KVConnect && maps.Equal(x.Labels, y.Labels)
	})
}

// Fixed is a discovery source with a fixed endpoint set (tests, the bench).
type Fixed []endpoint.Endpoint

// Run implements Source.
func (f Fixed) Run(ctx context.Context, update func([]endpoint.Endpoint)) error {
	update(append([]endpoint.Endpoint(nil), f...))
	<-ctx.Done()
	return nil
}
