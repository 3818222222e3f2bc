package scheduler

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/kvindex"
)

// matchBoth is speculative.match reading both generations at every key:
// the definition the match that skips a dominated previous generation
// must equal.
func matchBoth(sp *speculative, keys []kvindex.Key, now time.Time) []prefixHit {
	var out []prefixHit
	if sp.ttl <= 0 || len(keys) == 0 {
		return out
	}
	nowNs := now.UnixNano()
	for i := specStride - 1; ; i += specStride {
		if i >= len(keys) {
			i = len(keys) - 1
		}
		var live, prevLive bool
		if s := sp.cur.get(keys[i]); s != nil {
			out, live = s.val.hits(out, 0, nowNs, i+1)
		}
		if ps := sp.prev.get(keys[i]); ps != nil {
			out, prevLive = ps.val.hits(out, 0, nowNs, i+1)
		}
		if !live && !prevLive || i == len(keys)-1 {
			break
		}
	}
	return out
}

// specOps drives credits and matches from ops, two bytes an operation:
// prompts forked from one chain of keys at a few points, more replicas
// than a key has slots (credits replace one another), the clock moving
// forward by up to two ttls (generations rotate, credits expire) and now
// and then backward (a credit lowers an expiry), and checks every match
// against matchBoth: after a credit or another prompt, that prompt's;
// after the clock moved, the last one's.
func specOps(t *testing.T, ops []byte) {
	const ttl = 100 * time.Millisecond
	sp := newSpeculative(ttl)
	rng := rand.New(rand.NewPCG(uint64(len(ops)), 7))
	base := make([]kvindex.Key, 400)
	for i := range base {
		base[i] = kvindex.Key(rng.Uint64() | 1)
	}
	forks := [4][]kvindex.Key{}
	for f := range forks {
		at := []int{0, 37, 150, 399}[f]
		forks[f] = append(slices.Clone(base[:at]), make([]kvindex.Key, 400-at)...)
		for i := at; i < 400; i++ {
			forks[f][i] = kvindex.Key(rng.Uint64() | 1)
		}
	}
	now := time.Unix(1000, 0)
	keys := base[:1]
	for i := 0; i+1 < len(ops); i += 2 {
		op, arg := ops[i], int(ops[i+1])
		switch op >> 1 & 7 {
		case 0, 1, 2:
			keys = forks[op>>6&3][:arg%200+1+int(op&1)*200]
			sp.credit(kvindex.Replica(arg%7), keys, now)
		case 3: // later, the same prompt
			now = now.Add(time.Duration(arg) * 2 * ttl / 255)
		case 4:
			now = now.Add(-time.Duration(arg%16) * time.Millisecond)
		default: // another prompt
			keys = forks[op>>6&3][:arg%200+1+int(op&1)*200]
		}
		want := matchBoth(sp, keys, now)
		got := sp.match(keys, now, nil)
		require.Equal(t, want, got, "op %d", i/2)
	}
}

func TestSpeculativeMatchAgainstBoth(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4} {
		rng := rand.New(rand.NewPCG(seed, 11))
		ops := make([]byte, 4000)
		for i := range ops {
			ops[i] = byte(rng.Uint32())
		}
		specOps(t, ops)
	}
	// Every credit landing on the keys of one prompt from more replicas
	// than slots, with the clock still: the copies taken from the previous
	// generation lose replicas, and the match must read it again.
	var ops []byte
	for r := range 7 {
		ops = append(ops, 0, byte(r), 6, 200) // credit r, then a full ttl later
	}
	specOps(t, ops)
	// A credit from a clock read before the last rotation lowers an
	// expiry the previous generation holds later: once the clock passes
	// the lowered one, only the previous generation still credits it.
	specOps(t, []byte{0, 0, 6, 126, 0, 0, 6, 3, 0, 0, 8, 10, 0, 0, 6, 130})
}

func FuzzSpeculativeMatch(f *testing.F) {
	f.Add([]byte{0, 1, 6, 200, 2, 3, 8, 5, 64, 9})
	f.Add([]byte{0, 0, 0, 1, 0, 2, 0, 3, 0, 4, 6, 255, 0, 5})
	f.Add([]byte{0, 0, 6, 126, 0, 0, 6, 3, 0, 0, 8, 10, 0, 0, 6, 130})
	f.Fuzz(specOps)
}
