package vllm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/metrics"
)

// served waits for the gateway's report of the request tagged tag and
// returns the replica that served it.
func (f *fleet) served(t *testing.T, tag string) string {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case tm := <-f.timings:
			if tm.Tag == tag {
				return tm.Served
			}
		case <-timeout:
			t.Fatalf("the gateway reported no exchange tagged %s", tag)
		}
	}
}

func prefixHits(t *testing.T, f *fleet) float64 {
	t.Helper()
	sum := 0.0
	for _, r := range f.replicas {
		var s metrics.Signals
		require.NoError(t, metrics.Parse(get(t, r.base()+"/metrics"), &s))
		sum += s.PrefixHits
	}
	return sum
}

// TestRoutingToHolder: requests whose prefix one replica holds are routed
// there through the gateway and the EPP, and vLLM's own cached_tokens
// and prefix-cache counter confirm the hit.
func TestRoutingToHolder(t *testing.T) {
	f := getFleet(t)
	tokens := prompter(t, f)
	rng := rand.New(rand.NewPCG(53, 2))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Drain reports of earlier tests.
	for len(f.timings) > 0 {
		<-f.timings
	}
	const families, followUps = 8, 4
	var fams []func(string) chat
	for i := range families {
		fam := family(rng, 250+rng.IntN(150))
		fams = append(fams, fam)
		tag := fmt.Sprintf("seed-%d", i)
		_, err := send(ctx, f.gatewayURL(), fam(text(rng, 10)), tag)
		require.NoError(t, err)
		f.served(t, tag)
	}
	hitsBefore := prefixHits(t, f)
	holding, toHolder, confirmed, cachedSum := 0, 0, 0, 0
	for j := range followUps {
		for i, fam := range fams {
			c := fam(text(rng, 10+rng.IntN(20)))
			ids := tokens(c)
			f.settle(t)
			holder, prefix := f.index(t).holder(ids)
			tag := fmt.Sprintf("follow-%d-%d", i, j)
			u, err := send(ctx, f.gatewayURL(), c, tag)
			require.NoError(t, err)
			got := f.served(t, tag)
			if holder == "" {
				continue
			}
			holding++
			if got == holder {
				toHolder++
			}
			if u.cached() > 0 && u.cached() >= min(prefix, (len(ids)-1)/blockSize*blockSize)-blockSize {
				confirmed++
			}
			cachedSum += u.cached()
		}
	}
	hits := prefixHits(t, f) - hitsBefore
	t.Logf("%d prefix-holding requests: %d routed to the holder, %d with vLLM reporting the cached prefix; vllm:prefix_cache_hits_total +%.0f",
		holding, toHolder, confirmed, hits)
	require.GreaterOrEqual(t, holding, families*followUps*9/10, "too few requests had a prefix held: the test says little")
	require.GreaterOrEqual(t, float64(toHolder), 0.95*float64(holding), "routed to the holder")
	require.GreaterOrEqual(t, float64(confirmed), 0.95*float64(holding), "vLLM reported the cached prefix")
	require.GreaterOrEqual(t, hits, float64(cachedSum), "vLLM's prefix-cache hit counter did not count the hits")
}
