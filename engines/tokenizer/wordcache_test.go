package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func wordIDs(w string) []uint32 {
	ids := make([]uint32, 1+len(w)%7)
	for i := range ids {
		ids[i] = uint32(len(w)*1000 + i)
	}
	return ids
}

// TestWordCache checks the cache against its rules: a word just put is
// found with its ids, a hit never returns another word's ids, words too
// long are not kept, and the table grows from minCacheSlots to
// maxCacheSlots and no further.
func TestWordCache(t *testing.T) {
	c := newWordCache()
	require.Len(t, c.tab.Load().slots, minCacheSlots)
	_, ok := c.get(cacheHash("x"), "x")
	require.False(t, ok)
	long := string(make([]byte, maxCachedWord+1))
	c.put(cacheHash(long), long, []uint32{1})
	_, ok = c.get(cacheHash(long), long)
	require.False(t, ok)
	want := map[string][]uint32{}
	for i := 0; i < 3*maxCacheSlots; i++ {
		w := fmt.Sprintf("w%d-%s", i, "abcdefghijklmnopqrstuvwxyz"[:i%27])
		ids := wordIDs(w)
		c.put(cacheHash(w), w, ids)
		got, ok := c.get(cacheHash(w), w)
		require.True(t, ok, "%q just put", w)
		require.Equal(t, ids, got)
		want[w] = ids
	}
	require.Len(t, c.tab.Load().slots, maxCacheSlots)
	hits := 0
	for w, ids := range want {
		if got, ok := c.get(cacheHash(w), w); ok {
			require.Equal(t, ids, got, "%q", w)
			hits++
		}
	}
	require.Greater(t, hits, maxCacheSlots/2)
	require.LessOrEqual(t, hits, maxCacheSlots)
}

// TestWordCacheConcurrent has goroutines put and get the same words
// while the table grows (run with -race): every hit holds the word's ids.
func TestWordCacheConcurrent(t *testing.T) {
	c := newWordCache()
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 5))
			for i := 0; i < 20_000; i++ {
				w := fmt.Sprintf("%x", rng.IntN(40_000))
				if got, ok := c.get(cacheHash(w), w); ok {
					require.Equal(t, wordIDs(w), got, "%q", w)
					continue
				}
				c.put(cacheHash(w), w, wordIDs(w))
			}
		}()
	}
	wg.Wait()
	require.Greater(t, len(c.tab.Load().slots), minCacheSlots)
}
