// Package hexframes reads captured ZMQ messages kept as test data: one
// message a line, its frames hex-encoded and separated by spaces.
package hexframes

import (
	"encoding/hex"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Read returns the messages of the capture at path, each as its frames.
func Read(t testing.TB, path string) [][][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out [][][]byte
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var frames [][]byte
		for _, f := range strings.Fields(line) {
			v, err := hex.DecodeString(f)
			require.NoError(t, err, "%s: line %q", path, line)
			frames = append(frames, v)
		}
		out = append(out, frames)
	}
	return out
}
