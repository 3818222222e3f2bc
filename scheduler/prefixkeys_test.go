package scheduler

import (
	"slices"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/endpoint"
)

// heldRuns is a kvindex.CachedPrefix over toks cut at ends, as the
// tokenizer's prefix cache hands one out.
type heldRuns struct {
	ids   [][]uint32
	memos []*atomic.Value
	n     int
}

func (r *heldRuns) Len() int { return r.n }

func (r *heldRuns) AppendRuns(ids [][]uint32, memos []*atomic.Value) ([][]uint32, []*atomic.Value) {
	return append(ids, r.ids...), append(memos, r.memos...)
}

func newHeldRuns(toks []uint32, ends ...int) *heldRuns {
	r := &heldRuns{}
	for _, e := range ends {
		if e > len(toks) {
			break
		}
		r.ids, r.memos, r.n = append(r.ids, toks[r.n:e]), append(r.memos, new(atomic.Value)), e
	}
	return r
}

// upTo is r's leading runs that end at or before n ids, sharing their
// memos (an earlier turn of the conversation).
func (r *heldRuns) upTo(n int) *heldRuns {
	x := &heldRuns{}
	for i, ids := range r.ids {
		if x.n+len(ids) > n {
			break
		}
		x.ids, x.memos, x.n = append(x.ids, ids), append(x.memos, r.memos[i]), x.n+len(ids)
	}
	return x
}

// heldRequest is toks[:n] as the ext_proc server hands it over with the
// prefix cache's runs: p's runs that fit, then the rest in Tokens (nil
// when the runs hold it all).
func heldRequest(toks []uint32, n int, p *heldRuns) *Request {
	held := p.upTo(n)
	req := &Request{Model: testModel, Prefix: held, Tokens: toks[held.Len():n]}
	if held.Len() == n {
		req.Tokens = nil
	}
	return req
}

// checkTokens: the request's accessors give back the prompt toks.
func checkTokens(t *testing.T, req *Request, toks []uint32) {
	t.Helper()
	require.True(t, req.HasTokens())
	require.Equal(t, len(toks), req.TokenCount())
	require.Equal(t, int64(len(toks)), promptTokens(req))
	require.Equal(t, toks, req.AppendTokens(nil))
}

// TestPickWithCachedPrefix: a request whose ids come as the prefix
// cache's runs (Request.Prefix) and the tail after them (Tokens) is
// matched as the same request with every id in Tokens, the first time
// (memos filled) and after (memos read, with the speculative credits and
// routing memory of the picks before), for a prompt two replicas hold
// different parts of. Two schedulers alike take the same requests, one
// with the runs.
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
		{"runs ending on blocks", 1000, []int{320, 640, 960}},
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
			p := newHeldRuns(toks, tc.runs...)
			for i := range 4 {
				n := tc.tokens - 37*i // the same prompt, shorter each time
				plain, err := envs[0].s.admitPick(t.Context(), &Request{Model: testModel, Tokens: toks[:n]})
				require.NoError(t, err)
				req := heldRequest(toks, n, p)
				checkTokens(t, req, toks[:n])
				held, err := envs[1].s.admitPick(t.Context(), req)
				require.NoError(t, err)
				require.Equal(t, primary(plain), primary(held), "time %d", i)
				require.Equal(t, plain.PrefixBlocks, held.PrefixBlocks, "time %d", i)
				require.Equal(t, plain.PromptBlocks, held.PromptBlocks, "time %d", i)
				require.Equal(t, plain.Mode, held.Mode, "time %d", i)
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

// FuzzPickWithCachedPrefix: prompts of the fuzzer's length sharing one
// token sequence, cut into runs at the fuzzer's ends, on replicas holding
// the fuzzer's prefixes of it: two schedulers alike, one given every id
// in Tokens and one the runs and the tail, make the same decisions, pick
// after pick.
func FuzzPickWithCachedPrefix(f *testing.F) {
	f.Add([]byte{20, 40, 3}, []byte{100, 7, 200}, []byte{30, 90, 250, 60})
	f.Add([]byte{0, 0, 0}, []byte{16, 16, 16, 16}, []byte{255})
	f.Add([]byte{}, []byte{1, 1, 1}, []byte{5, 17})
	toks := tokens(4096, 9)
	f.Fuzz(func(t *testing.T, held, cuts, lens []byte) {
		var envs [2]*testEnv
		for k := range envs {
			e := newEnv(t, 3, nil)
			e.freshAll()
			for i, h := range held[:min(len(held), 3)] {
				e.store(i, toks[:int(h)*16])
			}
			envs[k] = e
		}
		var ends []int
		end := 0
		for _, c := range cuts {
			end += int(c)%256 + 1
			ends = append(ends, end)
		}
		p := newHeldRuns(toks, ends...)
		for i, l := range lens[:min(len(lens), 8)] {
			n := int(l) * 16 / 3
			plain, err := envs[0].s.admitPick(t.Context(), &Request{Model: testModel, Tokens: toks[:n]})
			require.NoError(t, err)
			req := heldRequest(toks, n, p)
			require.Equal(t, n, req.TokenCount())
			got, err := envs[1].s.admitPick(t.Context(), req)
			require.NoError(t, err)
			require.Equal(t, primary(plain), primary(got), "pick %d", i)
			require.Equal(t, plain.PrefixBlocks, got.PrefixBlocks, "pick %d", i)
			require.Equal(t, plain.PromptBlocks, got.PromptBlocks, "pick %d", i)
			require.Equal(t, plain.Reason, got.Reason, "pick %d", i)
			require.True(t, slices.EqualFunc(plain.Endpoints, got.Endpoints, func(a, b *endpoint.Endpoint) bool { return a.Addr == b.Addr }),
				"pick %d: the same fallbacks", i)
		}
	})
}
