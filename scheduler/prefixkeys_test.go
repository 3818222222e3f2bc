package scheduler

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// heldRuns is a kvindex.CachedPrefix over runs ending at ends, as the
// tokenizer's prefix cache hands one out.
type heldRuns struct {
	ends  []int
	memos []*atomic.Value
}

func (r *heldRuns) AppendRuns(ends []int, memos []*atomic.Value) ([]int, []*atomic.Value) {
	return append(ends, r.ends...), append(memos, r.memos...)
}

func newHeldRuns(ends ...int) *heldRuns {
	r := &heldRuns{ends: ends}
	for range ends {
		r.memos = append(r.memos, new(atomic.Value))
	}
	return r
}

// TestPickWithCachedPrefix: a request whose tokens come with the prefix
// cache's runs (Request.Prefix) is matched as the same request without
// them, the first time (memos filled) and after (memos read, with the
// speculative credits and routing memory of the picks before), for a
// prompt two replicas hold different parts of. Two schedulers alike take
// the same requests, one with the runs.
func TestPickWithCachedPrefix(t *testing.T) {
	toks := tokens(1000, 7)
	for _, tc := range []struct {
		name   string
		tokens int
		runs   []int
	}{
		{"whole prompt held by the runs", 1000, []int{100, 333, 700, 1000}},
		{"runs then a tail", 1000, []int{250, 500}},
		{"runs shorter than a block", 700, []int{5, 10, 15, 20, 25}},
		{"a short prompt", 400, []int{100, 333}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var envs [2]*testEnv
			for k := range envs {
				e := newEnv(t, 3, nil)
				e.freshAll()
				e.store(1, toks[:320]) // 20 blocks
				e.store(2, toks[:640]) // 40 blocks
				envs[k] = e
			}
			p := newHeldRuns(tc.runs...)
			for i := range 4 {
				n := tc.tokens - 37*i // the same prompt, shorter each time
				plain, err := envs[0].s.admitPick(t.Context(), &Request{Model: testModel, Tokens: toks[:n]})
				require.NoError(t, err)
				held, err := envs[1].s.admitPick(t.Context(), &Request{Model: testModel, Tokens: toks[:n], Prefix: p})
				require.NoError(t, err)
				require.Equal(t, primary(plain), primary(held), "time %d", i)
				require.Equal(t, plain.PrefixBlocks, held.PrefixBlocks, "time %d", i)
				require.Equal(t, plain.PromptBlocks, held.PromptBlocks, "time %d", i)
				if i == 0 {
					require.Equal(t, addr(2), primary(held), "the replica holding most")
					require.Equal(t, min(40, n/16), held.PrefixBlocks)
				}
			}
			filled := 0
			for _, m := range p.memos {
				if m.Load() != nil {
					filled++
				}
			}
			require.Positive(t, filled, "the runs' memos were filled")
		})
	}
}
