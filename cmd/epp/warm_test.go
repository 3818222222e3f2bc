package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/sim/engine"
	"github.com/omnious/provider-node/engines/sim/simtest"
	"github.com/omnious/provider-node/kvindex"
)

// block is one engine block as both sides can state it: the engine's
// hash, its parent, its tokens and the tiers holding it.
type block struct {
	parent    uint64
	hasParent bool
	tokens    string
	tiers     uint8
}

// engineBlocks is what a simulator holds, from GET /admin/blocks.
func engineBlocks(t *testing.T, base string) map[uint64]block {
	var view struct {
		Blocks []engine.ResidentBlock `json:"blocks"`
	}
	getJSON(t, base+"/admin/blocks", &view)
	out := map[uint64]block{}
	for _, b := range view.Blocks {
		e := out[b.Hash]
		e.parent, e.hasParent, e.tokens = b.ParentHash, b.HasParent, fmt.Sprint(b.TokenIDs)
		e.tiers |= 1 << kvindex.MediumTier(b.Medium)
		out[b.Hash] = e
	}
	return out
}

// eppBlocks is what an EPP's index follows per replica, from its own
// snapshot; an error means the EPP does not serve one yet.
func eppBlocks(admin string) (map[string]map[uint64]block, error) {
	resp, err := http.Get("http://" + admin + kvindex.SnapshotPath)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("snapshot: %s", resp.Status)
	}
	sr, err := kvindex.NewSnapshotReader(resp.Body, 1<<30)
	if err != nil {
		return nil, err
	}
	out := map[string]map[uint64]block{}
	for {
		sec, err := sr.NextReplica()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		blocks := map[uint64]block{}
		for {
			b, err := sr.NextBlock()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, err
			}
			blocks[b.Hash] = block{parent: b.Parent, hasParent: b.HasParent, tokens: fmt.Sprint(b.Tokens), tiers: b.Tiers}
		}
		out[sec.Name] = blocks
	}
}

// sameIndex reports whether the EPP at admin follows exactly what every
// engine holds: per replica the same blocks (hash, parent, tokens, tiers),
// and its index holds as many blocks for it.
func sameIndex(t *testing.T, admin string, truth map[string]map[uint64]block) (bool, string) {
	got, err := eppBlocks(admin)
	if err != nil {
		return false, err.Error()
	}
	res := map[string]int{}
	var eps []struct {
		Addr     string
		Resident int `json:"resident_blocks"`
	}
	resp, err := http.Get("http://" + admin + "/debug/endpoints")
	if err != nil {
		return false, err.Error()
	}
	err = json.NewDecoder(resp.Body).Decode(&eps)
	resp.Body.Close()
	if err != nil {
		return false, err.Error()
	}
	for _, e := range eps {
		res[e.Addr] = e.Resident
	}
	for addr, want := range truth {
		if len(got[addr]) != len(want) || res[addr] != len(want) {
			return false, fmt.Sprintf("%s: the EPP follows %d blocks and its index holds %d, the engine %d", addr, len(got[addr]), res[addr], len(want))
		}
		for h, b := range want {
			if got[addr][h] != b {
				return false, fmt.Sprintf("%s: block %#x differs", addr, h)
			}
		}
	}
	return true, ""
}

// series sums the series of an exposition whose line starts with prefix.
func series(t *testing.T, url, prefix string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	sum := 0.0
	for line := range strings.Lines(string(raw)) {
		if strings.HasPrefix(line, prefix) {
			var v float64
			_, err := fmt.Sscan(strings.TrimSpace(line[strings.LastIndexByte(line, ' '):]), &v)
			require.NoError(t, err, line)
			sum += v
		}
	}
	return sum
}

// TestWarmStartFromSiblingProcess runs three enginesim processes with a
// replay buffer of 32 batches and EPP #1, drives traffic until the engines
// hold more than their buffers could replay, then starts EPP #2 with EPP #1
// as its peer: within a second of its start EPP #2's index equals every
// engine's /admin/blocks, replica by replica. EPP #3, started cold with
// the same engines, can only replay the buffers' last batches.
func TestWarmStartFromSiblingProcess(t *testing.T) {
	dir := t.TempDir()
	simBin := simtest.Binary(t)
	eppBin := buildEPP(t, dir)
	const model = "Qwen/Qwen3-32B"

	addrs, endpoints := startFleet(t, simBin, dir, model, ", buffer_steps: 32")
	bases := make([]string, len(addrs))
	for i, a := range addrs {
		bases[i] = "http://" + a
	}

	// epp starts an EPP process and returns its admin and metrics addresses.
	epp := func(args ...string) (admin, metrics string) {
		port := func() string { return fmt.Sprintf("127.0.0.1:%d", simtest.FreePort(t)) }
		admin, metrics = port(), port()
		start(t, eppBin, append([]string{"-endpoints-file", endpoints, "-standin-tokenizer", "-log-level", "warn",
			"-grpc-addr", port(), "-health-addr", port(), "-metrics-addr", metrics, "-admin-addr", admin}, args...)...)
		return admin, metrics
	}
	first, _ := epp()
	simtest.WaitOK(t, "http://"+first+"/debug/index")

	// Traffic: groups of prompts sharing prefixes, as token ids, to every
	// engine, until each has published well past its replay buffer.
	rng := rand.New(rand.NewPCG(17, 18))
	for i := 0; i < 150; i++ {
		group := rng.IntN(8)
		p := make([]uint32, 0, 1200)
		for j := 0; j < 256+64*group; j++ {
			p = append(p, uint32(10000*group+j))
		}
		for j := 0; j < 16+rng.IntN(400); j++ {
			p = append(p, uint32(200000+rng.IntN(50000)))
		}
		raw, err := json.Marshal(map[string]any{"model": model, "prompt": p, "max_tokens": 4, "ignore_eos": true})
		require.NoError(t, err)
		resp, err := http.Post(bases[i%len(bases)]+"/v1/completions", "application/json", bytes.NewReader(raw))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	truth := map[string]map[uint64]block{}
	total := 0
	for _, b := range bases {
		truth[strings.TrimPrefix(b, "http://")] = engineBlocks(t, b)
		total += len(truth[strings.TrimPrefix(b, "http://")])
	}
	var why string
	require.Eventually(t, func() bool {
		var ok bool
		ok, why = sameIndex(t, first, truth)
		return ok
	}, 20*time.Second, 20*time.Millisecond, "EPP #1 follows the engines: %s", func() string { return why })

	// EPP #2 takes EPP #1's index.
	began := time.Now()
	second, secondMetrics := epp("-peers", first)
	var took time.Duration
	for {
		if ok, w := sameIndex(t, second, truth); ok {
			took = time.Since(began)
			break
		} else {
			why = w
		}
		require.Less(t, time.Since(began), 10*time.Second, "EPP #2 never agreed with the engines: %s", why)
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("EPP #2 index == engines (%d blocks on %d replicas) %v after its start", total, len(bases), took)
	require.Less(t, took, time.Second, "warm start within a second")
	// Every replica was resumed from the snapshot, none rebuilt from the
	// buffers (which no longer hold the engines' first batches).
	url := "http://" + secondMetrics + "/metrics"
	require.Equal(t, float64(len(bases)), series(t, url, `omnious_epp_kv_sequence_total{event="resume",`))
	require.Zero(t, series(t, url, `omnious_epp_kv_sequence_total{event="resume_failure",`))
	require.Zero(t, series(t, url, `omnious_epp_kv_sequence_total{event="start_replay",`))

	// EPP #3, cold, has only what the engines' 32-batch buffers replay.
	third, _ := epp()
	time.Sleep(time.Second)
	got, err := eppBlocks(third)
	require.NoError(t, err)
	cold := 0
	for addr, want := range truth {
		for h := range got[addr] {
			require.Contains(t, want, h, "a cold start never guesses a block")
		}
		cold += len(got[addr])
	}
	t.Logf("a cold EPP started at the same point follows %d of the %d blocks", cold, total)
	require.Less(t, cold, total)
}
