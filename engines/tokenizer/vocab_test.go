package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestVocabTable checks the table against the map it is built from: every
// token is found with its id, words that are not tokens (prefixes,
// extensions, random bytes) are not, and each visits every token once.
func TestVocabTable(t *testing.T) {
	for _, n := range []int{0, 1, 300, 50_000} {
		rng := rand.New(rand.NewPCG(uint64(n), 9))
		vocab := map[string]uint32{}
		for len(vocab) < n {
			b := make([]byte, 1+rng.IntN(12))
			for i := range b {
				b[i] = byte(rng.IntN(256))
			}
			if _, dup := vocab[string(b)]; !dup {
				vocab[string(b)] = uint32(len(vocab)) * 2 // sparse ids, as added tokens leave
			}
		}
		v := newVocabTable(vocab)
		for tok, id := range vocab {
			got, ok := v.get(tok, cacheHash(tok))
			require.True(t, ok, "%q", tok)
			require.Equal(t, id, got)
			for _, w := range []string{tok[:len(tok)-1], tok + "x", fmt.Sprintf("%x", tok)} {
				if _, in := vocab[w]; !in && w != "" {
					_, ok := v.get(w, cacheHash(w))
					require.False(t, ok, "%q", w)
				}
			}
		}
		seen := map[string]uint32{}
		v.each(func(tok []byte, id uint32) { seen[string(tok)] = id })
		require.Equal(t, len(vocab), len(seen))
		if n > 0 {
			require.Equal(t, vocab, seen)
		}
	}
}
