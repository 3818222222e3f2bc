package tokenizer

import (
	"os"
	"regexp"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestHugeTables checks hugeUint64s: n zeroed words that can be written,
// starting at a huge-page boundary when they fill one; and that the
// tables of a loaded tokenizer are made of them. Whether the kernel
// grants huge pages is advice it may refuse, so that is logged, not
// required (the notebook of the change measured it).
func TestHugeTables(t *testing.T) {
	for _, n := range []int{0, 1, 1000, hugePage/8 - 1, hugePage / 8, 3*hugePage/8 + 5} {
		s := hugeUint64s(n)
		require.Len(t, s, n)
		bad := -1
		for i := range s {
			if s[i] != 0 && bad < 0 {
				bad = i
			}
			s[i] = uint64(i)
		}
		require.Equal(t, -1, bad, "n=%d: word %d not zeroed", n, bad)
		for i := range s {
			if s[i] != uint64(i) && bad < 0 {
				bad = i
			}
		}
		require.Equal(t, -1, bad, "n=%d: word %d not as written", n, bad)
		if n*8 >= hugePage {
			require.Zero(t, uintptr(unsafe.Pointer(&s[0]))%hugePage, "n=%d", n)
		}
	}
	tok := loadFamily(t, "gptoss")
	for name, p := range map[string]unsafe.Pointer{
		"pair slots": unsafe.Pointer(&tok.merges.slots[0]),
		"charTok":    unsafe.Pointer(&tok.charTok[0]),
	} {
		require.Zero(t, uintptr(p)%hugePage, name)
	}
	if b, err := os.ReadFile("/proc/self/smaps_rollup"); err == nil {
		if m := regexp.MustCompile(`AnonHugePages:\s+(\d+ kB)`).FindSubmatch(b); m != nil {
			t.Logf("AnonHugePages: %s", m[1])
		}
	}
}
