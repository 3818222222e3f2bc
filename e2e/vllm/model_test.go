package vllm

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/internal/testutil/pyenv"
)

// modelDigest is the SHA-256 of model.safetensors as mkmodel.py writes it
// from the pinned torch and safetensors: the same bytes on every machine.
// A change to mkmodel.py changes it; update it with the digest this test
// prints.
const modelDigest = "2acbebcd5c8dc8c024109e9782f4d02644a6515253ae6c5225569c23815c5673"

func fileDigest(t *testing.T, path string) string {
	t.Helper()
	fh, err := os.Open(path)
	require.NoError(t, err)
	defer fh.Close()
	h := sha256.New()
	_, err = io.Copy(h, fh)
	require.NoError(t, err)
	return hex.EncodeToString(h.Sum(nil))
}

// TestModelDeterministic: mkmodel.py writes the same bytes twice, and the
// bytes every machine gets (modelDigest).
func TestModelDeterministic(t *testing.T) {
	python := pyenv.MustPython(t, "vllm")
	root, err := pyenv.Root()
	require.NoError(t, err)
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	require.NoError(t, buildModel(python, root, a))
	require.NoError(t, buildModel(python, root, b))
	for _, name := range []string{"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} {
		require.Equal(t, fileDigest(t, filepath.Join(a, name)), fileDigest(t, filepath.Join(b, name)), "%s differs between two builds", name)
	}
	require.Equal(t, modelDigest, fileDigest(t, filepath.Join(a, "model.safetensors")), "model.safetensors is not the pinned model")
}
