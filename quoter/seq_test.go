package quoter

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ethereum/go-ethereum/common"
	"github.com/stretchr/testify/require"
)

func TestSeqStorePersistsAcrossRestarts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	a, b := common.HexToAddress("0xa"), common.HexToAddress("0xb")
	s, err := OpenSeqStore(path)
	require.NoError(t, err)
	for want := uint64(1); want <= 3; want++ {
		n, err := s.Next(a, "m1")
		require.NoError(t, err)
		require.Equal(t, want, n)
	}
	n, err := s.Next(a, "m2")
	require.NoError(t, err)
	require.Equal(t, uint64(1), n, "seq is per model")
	n, err = s.Next(b, "m1")
	require.NoError(t, err)
	require.Equal(t, uint64(1), n, "seq is per provider")

	s2, err := OpenSeqStore(path)
	require.NoError(t, err)
	require.Equal(t, uint64(3), s2.Last(a, "m1"))
	n, err = s2.Next(a, "m1")
	require.NoError(t, err)
	require.Equal(t, uint64(4), n)

	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary files are left behind")
}

func TestSeqStoreErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte("{not json"), 0o600))
	_, err := OpenSeqStore(bad)
	require.ErrorContains(t, err, "cannot parse sequence state")

	v2 := filepath.Join(dir, "v2.json")
	require.NoError(t, os.WriteFile(v2, []byte(`{"version":2,"seq":{}}`), 0o600))
	_, err = OpenSeqStore(v2)
	require.ErrorContains(t, err, "version 2")

	// A failed write hands out nothing and does not advance.
	s, err := OpenSeqStore(filepath.Join(dir, "missing-dir", "state.json"))
	require.NoError(t, err)
	_, err = s.Next(common.Address{}, "m")
	require.Error(t, err)
	require.Equal(t, uint64(0), s.Last(common.Address{}, "m"))
}
