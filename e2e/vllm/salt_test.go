package vllm

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/kvindex"
)

// predictedSalted is predicted for a request with cache_salt salt.
func (ix index) predictedSalted(addr, salt string, tokens []uint32) int {
	keys := kvindex.AppendBlockKeys(nil, kvindex.RootKey(model, "", salt), tokens, blockSize)
	for _, m := range ix.snap.Index.Match(keys, nil) {
		if ix.names[m.Replica] == addr {
			return m.Blocks * blockSize
		}
	}
	return 0
}

// sendSalted posts a one-token chat with cache_salt salt ("" for none)
// straight to a replica and returns vLLM's usage.
func sendSalted(ctx context.Context, base string, c chat, salt string) (usage, error) {
	body := map[string]any{"model": model, "messages": c, "max_tokens": 1, "temperature": 0}
	if salt != "" {
		body["cache_salt"] = salt
	}
	var out struct {
		Usage usage `json:"usage"`
	}
	err := postJSON(ctx, base+"/v1/chat/completions", body, &out)
	return out.Usage, err
}

// TestCacheSaltEqualsEngine: vLLM mixes a request's cache_salt into its
// block hashes and reports it in the first block's extra_keys. After a
// chat with a salt, the prefix the EPP predicts for the same prompt equals
// the cached tokens vLLM reports: the whole prompt under that salt, none
// without a salt or under another salt; and once the unsalted prompt ran,
// its own blocks match it.
func TestCacheSaltEqualsEngine(t *testing.T) {
	f := getFleet(t)
	tokens := prompter(t, f)
	rng := rand.New(rand.NewPCG(53, 9))
	c := family(rng, 200)(text(rng, 12))
	ids := tokens(c)
	full := (len(ids) - 1) / blockSize * blockSize
	require.GreaterOrEqual(t, full, 4*blockSize, "the prompt is too short to test")
	r := f.replicas[0]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	for _, step := range []struct {
		salt string
		want int // cached tokens vLLM must report
	}{
		{"tenant-a", 0},    // a new prompt
		{"tenant-a", full}, // the same salt: the whole prompt
		{"", 0},            // no salt: tenant-a's blocks are not the unsalted prompt's
		{"tenant-b", 0},    // another salt
		{"", full},         // the unsalted prompt's own blocks
		{"tenant-b", full}, // and tenant-b's, still held
	} {
		f.settle(t)
		predicted := min(f.index(t).predictedSalted(r.addr(), step.salt, ids), full)
		u, err := sendSalted(ctx, r.base(), c, step.salt)
		require.NoError(t, err)
		require.Equal(t, len(ids), u.PromptTokens, "salt %q: prompt tokens", step.salt)
		require.Equal(t, step.want, u.cached(), "salt %q: vLLM's cached tokens", step.salt)
		require.Equal(t, u.cached(), predicted, "salt %q: the index predicts %d cached tokens, vLLM reports %d",
			step.salt, predicted, u.cached())
	}
}
