package kvindex

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestIDs(t *testing.T) {
	ix := New(Config{})
	ids := NewIDs()
	got := map[string]Replica{}
	for _, name := range []string{"a", "b", "c"} {
		id, err := ids.Assign(name)
		require.NoError(t, err)
		got[name] = id
	}
	require.Len(t, map[Replica]bool{got["a"]: true, got["b"]: true, got["c"]: true}, 3, "distinct ids")
	again, err := ids.Assign("b")
	require.NoError(t, err)
	require.Equal(t, got["b"], again, "a name keeps its id")

	keys := AppendBlockKeys(nil, RootKey("m", "", ""), make([]uint32, 64), 16)
	ix.Store(got["b"], TierGPU, keys)
	require.Equal(t, 4, ix.Resident(got["b"]))

	// b leaves: its entries are cleared and its id is not reused by a
	// newcomer while fresh ids remain.
	ids.Retain(func(name string) bool { return name != "b" }, ix)
	_, ok := ids.Lookup("b")
	require.False(t, ok)
	require.Zero(t, ix.Resident(got["b"]))
	d, err := ids.Assign("d")
	require.NoError(t, err)
	require.NotContains(t, []Replica{got["a"], got["b"], got["c"]}, d)
	for _, name := range []string{"a", "c"} {
		id, ok := ids.Lookup(name)
		require.True(t, ok)
		require.Equal(t, got[name], id)
	}
}

func TestIDsExhausted(t *testing.T) {
	ids := NewIDs()
	ids.next = 1 << 16 // every fresh id handed out
	_, err := ids.Assign("x")
	require.ErrorIs(t, err, errNoFreeID)
	ids.freed = []Replica{7}
	id, err := ids.Assign("x")
	require.NoError(t, err)
	require.Equal(t, Replica(7), id, "freed ids are reused once fresh ones run out")
}
