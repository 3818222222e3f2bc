package vllm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// probe compares, for each chat and each replica, the prefix the EPP's
// index says the replica holds with the cached tokens vLLM reports when
// the chat is then sent to that replica. Each probe changes the cache it
// probes, so the index is read again before every one. vLLM never serves
// a prompt's last token from cache, so a prediction is capped at the
// full blocks before it. It returns how many probes agreed exactly and
// how many found a prefix.
func probe(t *testing.T, f *fleet, tokens func(chat) []uint32, chats []chat) (exact, hits int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for i, c := range chats {
		ids := tokens(c)
		for _, r := range f.replicas {
			f.settle(t)
			want := min(f.index(t).predicted(r.addr(), ids), (len(ids)-1)/blockSize*blockSize)
			u, err := send(ctx, r.base(), c, "")
			require.NoError(t, err)
			require.Equal(t, len(ids), u.PromptTokens, "chat %d: prompt tokens", i)
			got := u.cached()
			require.InDelta(t, want, got, blockSize,
				"chat %d on %s: the index predicts %d cached tokens, vLLM reports %d", i, r.name, want, got)
			if want == got {
				exact++
			}
			if got > 0 {
				hits++
			}
		}
	}
	t.Logf("%d of %d probes exact, %d found a cached prefix", exact, len(chats)*len(f.replicas), hits)
	return exact, hits
}

// pressure sends families of chats through the gateway, more than the
// replicas' caches hold, so that vLLM evicts; it returns one chat of each
// family (already sent) and one new member of each (never sent).
func pressure(t *testing.T, f *fleet, rng *rand.Rand, families, members int) (sent, fresh []chat) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, families*members)
	sem := make(chan struct{}, 4)
	for range families {
		fam := family(rng, 300+rng.IntN(300))
		var qs []string
		for range members + 1 {
			qs = append(qs, text(rng, 8+rng.IntN(40)))
		}
		sent = append(sent, fam(qs[0]))
		fresh = append(fresh, fam(qs[members]))
		for m := range members {
			c := fam(qs[m])
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				if _, err := send(ctx, f.gatewayURL(), c, ""); err != nil {
					errs <- err
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	return sent, fresh
}

// TestIndexEqualsEngine: vLLM is the truth. After a workload under
// eviction pressure, after /reset_prefix_cache, after a KV-event batch
// lost on the wire (recovered by replay) and after a vLLM restart
// (sequence back to 0), the prefix the EPP predicts each replica holds
// equals the cached tokens vLLM reports for the same prompt, to within
// one block.
func TestIndexEqualsEngine(t *testing.T) {
	f := getFleet(t)
	tokens := prompter(t, f)
	rng := rand.New(rand.NewPCG(53, 1))

	t.Run("eviction", func(t *testing.T) {
		// 24 families of 4 members, 300-600 system words each: about
		// 1,500 blocks over two caches of 256.
		sent, fresh := pressure(t, f, rng, 24, 4)
		f.requireEvicted(t)
		_, hits := probe(t, f, tokens, append(sent[len(sent)-6:], fresh[:3]...))
		require.Positive(t, hits, "no probe found a cached prefix: the probes test nothing")
	})

	t.Run("reset_prefix_cache", func(t *testing.T) {
		sent, _ := pressure(t, f, rng, 4, 2)
		f.settle(t)
		r := f.replicas[0]
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, postJSON(ctx, r.base()+"/reset_prefix_cache", nil, nil))
		// vLLM queues AllBlocksCleared at the reset and publishes it with
		// the events of its next engine step (Scheduler.update_from_output):
		// until a request runs, the wire still says the blocks are there.
		_, err := send(ctx, r.base(), chat{{"role": "user", "content": "step"}}, "")
		require.NoError(t, err)
		f.settle(t)
		ix := f.index(t)
		for _, c := range sent {
			require.Zero(t, ix.predicted(r.addr(), tokens(c)), "the index still holds a prefix on the reset replica")
		}
		probe(t, f, tokens, sent[:3])
	})

	t.Run("dropped_batch", func(t *testing.T) {
		r := f.replicas[0]
		fam := family(rng, 400)
		a, b := fam(text(rng, 20)), fam(text(rng, 20))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		f.settle(t)
		r.relay.dropNext(1)
		_, err := send(ctx, r.base(), a, "")
		require.NoError(t, err)
		f.settle(t)
		// The batch holding a's blocks never reached the EPP; b's batch
		// shows the gap, and the EPP replays it from vLLM.
		_, err = send(ctx, r.base(), b, "")
		require.NoError(t, err)
		f.settle(t)
		require.Eventually(t, func() bool {
			return f.index(t).predicted(r.addr(), tokens(a)) >= (len(tokens(a))-1)/blockSize*blockSize
		}, 10*time.Second, 200*time.Millisecond, "the dropped batch was not recovered by replay")
		probe(t, f, tokens, []chat{a, b})
	})

	t.Run("restart", func(t *testing.T) {
		r := f.replicas[1]
		sent, _ := pressure(t, f, rng, 4, 2)
		f.settle(t)
		require.NoError(t, r.stop())
		require.NoError(t, r.start())
		require.NoError(t, r.waitReady(context.Background()))
		// The restarted engine holds nothing and numbers its batches from
		// 0 again: its first batch must clear what the index held.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := send(ctx, r.base(), family(rng, 100)(text(rng, 10)), "")
		require.NoError(t, err)
		f.settle(t)
		require.Eventually(t, func() bool {
			ix := f.index(t)
			for _, c := range sent {
				if ix.predicted(r.addr(), tokens(c)) != 0 {
					return false
				}
			}
			return true
		}, 10*time.Second, 200*time.Millisecond, "the index still holds the restarted replica's old blocks")
		probe(t, f, tokens, sent[:3])
	})
}

// requireEvicted fails unless some replica evicted blocks (vLLM's
// BlockRemoved events reached the relay).
func (f *fleet) requireEvicted(t *testing.T) {
	t.Helper()
	f.settle(t)
	n := 0
	for _, r := range f.replicas {
		n += int(r.relay.removedBlocks())
	}
	require.Positive(t, n, "no replica evicted a block: the workload put no pressure on the caches")
	t.Logf("%s", fmt.Sprintf("%d blocks evicted", n))
}
