package kvindex

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

// tokensSlow is decoder.tokens as one uvarint call a token.
func tokensSlow(b []byte, n int) ([]uint32, []byte, bool) {
	out := make([]uint32, n)
	for i := range out {
		v, k := binary.Uvarint(b)
		if k <= 0 || v > 1<<32-1 {
			return nil, nil, false
		}
		out[i], b = uint32(v), b[k:]
	}
	return out, b, true
}

// FuzzSnapshotTokens: the inline token decoder accepts exactly what
// binary.Uvarint does, values up to 2^32-1, with the same values and
// the same bytes left over.
func FuzzSnapshotTokens(f *testing.F) {
	var seed []byte
	for _, v := range []uint64{0, 1, 127, 128, 16383, 16384, 151935, 1<<21 - 1, 1 << 21, 1<<32 - 1, 1 << 32} {
		seed = binary.AppendUvarint(seed, v)
	}
	f.Add(seed, uint8(11))
	f.Add([]byte{0x80, 0x00, 0x81, 0x80, 0x00, 0x05}, uint8(3)) // non-minimal encodings
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, uint8(1))
	f.Add([]byte{0x80}, uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, n uint8) {
		want, rest, ok := tokensSlow(data, int(n))
		d := decoder{b: data}
		got := make([]uint32, n)
		d.tokens(got)
		require.Equal(t, !ok, d.bad)
		if ok {
			require.Equal(t, want, got)
			require.Equal(t, rest, d.b)
		}
	})
}

// TestSnapshotTokens: the cases FuzzSnapshotTokens's seeds cover, by
// value.
func TestSnapshotTokens(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		n    int
		want []uint32
		bad  bool
	}{
		{"one byte each", []byte{1, 2, 3}, 3, []uint32{1, 2, 3}, false},
		{"two and three bytes", []byte{0x80, 0x01, 0xff, 0xff, 0x7f, 9}, 3, []uint32{128, 1<<21 - 1, 9}, false},
		{"last near the end", []byte{0x80, 0x01}, 1, []uint32{128}, false},
		{"32 bits", []byte{0xff, 0xff, 0xff, 0xff, 0x0f}, 1, []uint32{1<<32 - 1}, false},
		{"33 bits", []byte{0x80, 0x80, 0x80, 0x80, 0x10}, 1, nil, true},
		{"cut short", []byte{0x80, 0x80}, 1, nil, true},
		{"too few", []byte{1, 2}, 3, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := decoder{b: tc.in}
			got := make([]uint32, tc.n)
			d.tokens(got)
			require.Equal(t, tc.bad, d.bad)
			if !tc.bad {
				require.Equal(t, tc.want, got)
				require.Empty(t, d.b)
			}
		})
	}
}
