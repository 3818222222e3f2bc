package epp

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/discovery"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/extproc"
	"github.com/omnious/provider-node/kvindex"
)

// TestUpdateOwnsReplicaIDs: the assembly gives the scheduler and the index
// the same ids, keeps them while endpoints stay, and clears a departed
// endpoint's blocks before its id can be reused.
func TestUpdateOwnsReplicaIDs(t *testing.T) {
	cfg, err := Parse([]byte("grpc_addr: 127.0.0.1:0\nhealth_addr: 127.0.0.1:0\nmetrics_addr: 127.0.0.1:0\nadmin_addr: 127.0.0.1:0\n"))
	require.NoError(t, err)
	e, err := New(cfg, discovery.Fixed(nil), zap.NewNop())
	require.NoError(t, err)
	defer e.closeListeners()
	defer e.ingest.Close()

	ep := func(addr string) endpoint.Endpoint { return endpoint.Endpoint{Addr: addr, Model: "m", Engine: "vllm"} }
	e.update([]endpoint.Endpoint{ep("a:1"), ep("b:1"), ep("c:1")})
	ids := map[string]kvindex.Replica{}
	for _, addr := range []string{"a:1", "b:1", "c:1"} {
		id, ok := e.ids.Lookup(addr)
		require.True(t, ok, addr)
		ids[addr] = id
	}
	keys := kvindex.AppendBlockKeys(nil, kvindex.RootKey("m", "", ""), make([]uint32, 64), cfg.Scheduler.BlockSize)
	e.ix.Store(ids["b:1"], kvindex.TierGPU, keys)
	require.Equal(t, 4, e.ix.Resident(ids["b:1"]))

	e.update([]endpoint.Endpoint{ep("a:1"), ep("c:1"), ep("d:1")})
	_, ok := e.ids.Lookup("b:1")
	require.False(t, ok)
	require.Zero(t, e.ix.Resident(ids["b:1"]), "a departed endpoint's blocks are cleared")
	for _, addr := range []string{"a:1", "c:1"} {
		id, _ := e.ids.Lookup(addr)
		require.Equal(t, ids[addr], id, "an endpoint that stays keeps its id")
	}
	d, ok := e.ids.Lookup("d:1")
	require.True(t, ok)
	require.NotContains(t, []kvindex.Replica{ids["a:1"], ids["b:1"], ids["c:1"]}, d)
	snap := e.sched.Capacity()
	require.Len(t, snap.Models, 1)
	require.Equal(t, 3, snap.Models[0].Replicas)
}

// TestModelEngines: the ext_proc server is told each model's engine
// families; an endpoint naming none is vLLM, discovery's default.
func TestModelEngines(t *testing.T) {
	got := modelEngines([]endpoint.Endpoint{{Model: "a", Engine: "vllm"}, {Model: "a"}, {Model: "b", Engine: "sglang"},
		{Model: "c", Engine: "sglang"}, {Model: "c", Engine: "vllm"}})
	require.Equal(t, map[string]extproc.Engines{"a": extproc.EngineVLLM, "b": extproc.EngineSGLang,
		"c": extproc.EngineVLLM | extproc.EngineSGLang}, got)
}
