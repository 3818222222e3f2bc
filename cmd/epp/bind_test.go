package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/sim/simtest"
)

// TestEnginesThatConnect runs the EPP with a bound KV-event socket and two
// enginesim processes that publish by connecting to it, llm-d style, each
// with its own kv@<ip>:<port>@<model> topic: the EPP's index follows both
// engines' blocks exactly.
func TestEnginesThatConnect(t *testing.T) {
	dir := t.TempDir()
	simBin := simtest.Binary(t)
	eppBin := buildEPP(t, dir)
	const model = "Qwen/Qwen3-32B"

	port := func() int { return simtest.FreePort(t) }
	bind := fmt.Sprintf("tcp://127.0.0.1:%d", port())
	httpPorts := []int{port(), port()}
	var file strings.Builder
	fmt.Fprintf(&file, "defaults: {model: %s, kv_events_connect: true}\nendpoints:\n", model)
	for _, p := range httpPorts {
		fmt.Fprintf(&file, "  - {ip: 127.0.0.1, port: %d}\n", p)
	}
	endpoints := filepath.Join(dir, "endpoints.yaml")
	require.NoError(t, os.WriteFile(endpoints, []byte(file.String()), 0o600))
	admin, metrics := fmt.Sprintf("127.0.0.1:%d", port()), fmt.Sprintf("127.0.0.1:%d", port())
	start(t, eppBin, "-endpoints-file", endpoints, "-standin-tokenizer", "-log-level", "warn", "-kv-events-bind", bind,
		"-grpc-addr", fmt.Sprintf("127.0.0.1:%d", port()), "-health-addr", fmt.Sprintf("127.0.0.1:%d", port()),
		"-metrics-addr", metrics, "-admin-addr", admin)
	simtest.WaitOK(t, "http://"+admin+"/debug/index")

	var bases []string
	for i, p := range httpPorts {
		start(t, simBin, "-listen", fmt.Sprintf("127.0.0.1:%d", p), "-kv-events-endpoint", bind, "-kv-events-connect",
			"-kv-events-topic", fmt.Sprintf("kv@127.0.0.1:%d@%s", p, model), "-time-scale", "50", "-seed", fmt.Sprint(i), "-log-level", "warn")
		bases = append(bases, fmt.Sprintf("http://127.0.0.1:%d", p))
	}
	for _, b := range bases {
		simtest.WaitOK(t, b+"/health")
	}
	// ZMQ drops what is sent before the connection is up: send prompts
	// until each engine's first blocks show in the index, then the rest.
	send := func(base string, p []uint32) {
		raw, err := json.Marshal(map[string]any{"model": model, "prompt": p, "max_tokens": 2, "ignore_eos": true})
		require.NoError(t, err)
		resp, err := http.Post(base+"/v1/completions", "application/json", bytes.NewReader(raw))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	prompt := func(seed, n int) []uint32 {
		p := make([]uint32, n)
		for i := range p {
			p[i] = uint32(seed*1000 + i)
		}
		return p
	}
	for i, b := range bases {
		n := 0
		require.Eventually(t, func() bool {
			n++
			send(b, prompt(100*i+n, 48))
			return resident(t, admin)[strings.TrimPrefix(b, "http://")] > 0
		}, 10*time.Second, 20*time.Millisecond, "events of %s reach the index", b)
	}
	for j := 0; j < 20; j++ {
		send(bases[j%2], prompt(5000+j/4, 64+16*(j%5)))
	}
	require.Eventually(t, func() bool {
		r := resident(t, admin)
		for _, b := range bases {
			if r[strings.TrimPrefix(b, "http://")] != len(engineBlocks(t, b)) {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond, "the index holds what each engine holds")
	require.Zero(t, series(t, "http://"+metrics+"/metrics", `omnious_epp_kv_events_total{outcome="unknown_topic",replica="bound"}`))
}

// resident is the EPP's resident blocks per endpoint, from its admin view.
func resident(t *testing.T, admin string) map[string]int {
	var eps []struct {
		Addr     string
		Resident int `json:"resident_blocks"`
	}
	getJSON(t, "http://"+admin+"/debug/endpoints", &eps)
	out := map[string]int{}
	for _, e := range eps {
		out[e.Addr] = e.Resident
	}
	return out
}
