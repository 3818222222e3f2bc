package rig

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/omnious/provider-node/bench/internal/launch"
	"github.com/omnious/provider-node/bench/internal/promtext"
	"github.com/omnious/provider-node/endpoint"
)

// writeEndpointsFile writes eps (simulated replicas standing in for
// running engines) as the EPP's static endpoint file: with their KV-event
// and replay ports when events is set, without otherwise.
func writeEndpointsFile(t *testing.T, eps []endpoint.Endpoint, events bool) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("endpoints:\n")
	for _, ep := range eps {
		port := ep.Addr[strings.LastIndexByte(ep.Addr, ':')+1:]
		fmt.Fprintf(&b, "  - {ip: 127.0.0.1, port: %s, model: %q", port, ep.Model)
		if events {
			kv := ep.KVEvents[strings.LastIndexByte(ep.KVEvents, ':')+1:]
			replay := ep.KVReplay[strings.LastIndexByte(ep.KVReplay, ':')+1:]
			fmt.Fprintf(&b, ", kv_events_port: %s, replay_port: %s", kv, replay)
		}
		b.WriteString("}\n")
	}
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o644))
	return path
}

// complete sends one completion through the gateway at base.
func complete(t *testing.T, base, model, prompt string) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 1})
	require.NoError(t, err)
	resp, err := http.Post(base+"/v1/completions", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// eppFigures reads what the EPP's metrics say of its routing so far: the
// requests routed with exact tokens, and the summed share of each prompt
// the index showed held on the replica chosen.
func eppFigures(t *testing.T, e *launch.EPP) (precise, hitRatio float64) {
	t.Helper()
	page, err := e.Metrics(context.Background())
	require.NoError(t, err)
	precise, _, err = promtext.SumWhere(page, "omnious_extproc_prompt_mode_total", map[string]string{"mode": "precise"})
	require.NoError(t, err)
	_, err = page.Seek(0, 0)
	require.NoError(t, err)
	sums, _, err := promtext.Sum(page, "inference_extension_prefix_indexer_hit_ratio_sum")
	require.NoError(t, err)
	return precise, sums[0]
}

// TestURLFleetRoutesPrecise: a fleet of running engines attached from the
// EPP's own endpoint file, with their KV events, the simulator's tokenizer
// (exact for it, as the model's is for vLLM) and no block size given, is
// routed precise: the EPPs key prompts with the block size the engines
// report (32, not the scheduler's 16) and their index, fed by the
// engines' events alone, holds the prefix of a prompt sent before. A URL
// fleet (no events) and a block size forced to 16 show what each part
// brings.
func TestURLFleetRoutesPrecise(t *testing.T) {
	ctx := context.Background()
	log := zaptest.NewLogger(t)
	sims := Options{Fleet: FleetOptions{Replicas: 2, BlockSize: 32}}.WithDefaults()
	f, err := StartFleet(ctx, sims.Fleet, 1, 4096, log)
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Stop()) }()
	model := f.Endpoints()[0].Model
	var urls []string
	for _, ep := range f.Endpoints() {
		urls = append(urls, "http://"+ep.Addr)
	}

	for _, tt := range []struct {
		name      string
		fleet     FleetOptions
		blockSize int
		held      bool // the index holds the earlier prompt's prefix
	}{
		{"endpoint file with KV events", FleetOptions{EndpointsFile: writeEndpointsFile(t, f.Endpoints(), true)}, 32, true},
		{"block size forced to 16", FleetOptions{EndpointsFile: writeEndpointsFile(t, f.Endpoints(), true), Engines: EngineOptions{BlockSize: 16}}, 16, false},
		{"URLs: no KV events", FleetOptions{URLs: urls}, 32, false},
		{"the bench's own fleet", FleetOptions{}, 32, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var target *EPPTarget
			eps := f.Endpoints()
			if own := tt.fleet.EndpointsFile == "" && tt.fleet.URLs == nil; own {
				// The simulated replicas as the bench started them,
				// standing for a fleet started with -block-size 32.
				target, err = StartEPPs(ctx, log, "precise", eps, 1, nil)
				require.NoError(t, err)
			} else {
				o := tt.fleet
				o.Mode, o.Engines.Tokenizer = FleetURLs, launch.TokenizerStandIn
				opts := Options{Fleet: o}.WithDefaults()
				require.NoError(t, opts.Validate())
				require.Equal(t, 2, opts.Fleet.Replicas, "the report counts the engines")
				uf, err := StartFleet(ctx, opts.Fleet, 1, 4096, log)
				require.NoError(t, err)
				defer func() { require.NoError(t, uf.Stop()) }()
				eps = uf.Endpoints()
				eng, err := opts.Fleet.Engines.Resolve(ctx, eps)
				require.NoError(t, err)
				require.Equal(t, tt.blockSize, eng.BlockSize)
				require.Equal(t, ExternalScrapeTimeout, eng.ScrapeTimeout)
				target, err = StartEPPsOn(ctx, log, "precise", eps, opts.Fleet.Engines, 1, nil)
				require.NoError(t, err)
			}
			defer func() { require.NoError(t, target.Close()) }()
			e := target.EPPs()[0]

			// 40 blocks of 32 shared, then a question of its own each.
			shared := words(7, tt.name, 0, 0, 1280)
			complete(t, target.URL(), model, shared+" first question")
			if tt.fleet.URLs == nil { // the engines' KV events reach the EPPs
				require.Eventually(t, func() bool {
					held, err := e.ResidentBlocks(ctx)
					require.NoError(t, err)
					return held[eps[0].Addr]+held[eps[1].Addr] >= 40
				}, 10*time.Second, 20*time.Millisecond, "the engines' KV events reach the index")
			}
			// Past the speculative credit of the first decision: what the
			// index holds now came from the engines' events.
			time.Sleep(2*time.Second + 500*time.Millisecond)
			_, before := eppFigures(t, e)
			complete(t, target.URL(), model, shared+" second question")
			precise, after := eppFigures(t, e)
			require.Equal(t, 2.0, precise, "both requests routed with exact tokens")
			ratio := after - before
			if tt.held {
				require.Greater(t, ratio, 0.9, "the shared 40 of 41 blocks found held")
			} else {
				require.Less(t, ratio, 0.1, "no prefix found: %s", tt.name)
			}
		})
	}
}

// TestEngineOptionsResolve: the block size is the engines' own, one for
// all, unless given; what is not on loopback or not readable is refused.
func TestEngineOptionsResolve(t *testing.T) {
	page := func(body string) string {
		srv := http.NewServeMux()
		srv.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(body)) })
		s := &http.Server{Handler: srv}
		ln := listen(t)
		go func() { _ = s.Serve(ln) }()
		t.Cleanup(func() { _ = s.Close() })
		return "http://" + ln.Addr().String() + "/metrics"
	}
	b16 := page(`vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1` + "\n")
	b32 := page(`vllm:cache_config_info{block_size="32",num_gpu_blocks="100"} 1` + "\n")
	sgl := page(`sglang:cache_config_info{page_size="32",num_pages="100"} 1` + "\n")
	none := page("vllm:num_requests_running 0\n")
	ep := func(u string) endpoint.Endpoint {
		return endpoint.Endpoint{Addr: strings.TrimSuffix(u[7:], "/metrics"), MetricsURL: u}
	}
	for _, tt := range []struct {
		name  string
		eng   EngineOptions
		fleet []endpoint.Endpoint
		want  int
		err   string
	}{
		{"vLLM's block_size", EngineOptions{}, []endpoint.Endpoint{ep(b32), ep(b32)}, 32, ""},
		{"SGLang's page_size", EngineOptions{}, []endpoint.Endpoint{ep(sgl)}, 32, ""},
		{"given, not read", EngineOptions{BlockSize: 64}, []endpoint.Endpoint{ep(b16)}, 64, ""},
		{"none reported: the scheduler's", EngineOptions{}, []endpoint.Endpoint{ep(none), {Addr: "127.0.0.1:1"}}, 0, ""},
		{"disagreeing engines", EngineOptions{}, []endpoint.Endpoint{ep(b16), ep(b32)}, 0, "disagree"},
		{"unreadable metrics", EngineOptions{}, []endpoint.Endpoint{{Addr: "127.0.0.1:1", MetricsURL: "http://127.0.0.1:1/metrics"}}, 0, "cannot read the block size"},
		{"negative block size", EngineOptions{BlockSize: -1}, nil, 0, "block size -1"},
		{"negative scrape timeout", EngineOptions{ScrapeTimeout: -time.Second}, nil, 0, "scrape timeout"},
		{"tokenizer without tokenizer.json", EngineOptions{Tokenizer: t.TempDir()}, nil, 0, "tokenizer.json"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.eng.Resolve(context.Background(), tt.fleet)
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got.BlockSize)
		})
	}
}

// TestEndpointsFileLoopbackOnly: the bench attaches to engines on this
// machine only, KV-event ports included.
func TestEndpointsFileLoopbackOnly(t *testing.T) {
	for _, tt := range []struct{ name, file, err string }{
		{"remote engine", "endpoints:\n  - {ip: 10.0.0.1, port: 8000, model: m}\n", "not on loopback"},
		{"connecting engine", "endpoints:\n  - {ip: 127.0.0.1, port: 8000, model: m, kv_events_connect: true}\n", "kv_events_connect"},
		{"empty", "endpoints: []\n", "no endpoint"},
		{"not the EPP's format", "endpoints:\n  - {url: http://127.0.0.1:8000}\n", "endpoint file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "endpoints.yaml")
			require.NoError(t, os.WriteFile(path, []byte(tt.file), 0o644))
			_, err := StartFleet(context.Background(), FleetOptions{Mode: FleetURLs, EndpointsFile: path}, 1, 1, zaptest.NewLogger(t))
			require.ErrorContains(t, err, tt.err)
		})
	}
	eps, err := readEndpointsFile(writeEndpointsFile(t, []endpoint.Endpoint{{Addr: "127.0.0.1:8000", Model: "m",
		KVEvents: "tcp://127.0.0.1:5557", KVReplay: "tcp://127.0.0.1:5558"}}, true))
	require.NoError(t, err)
	require.Equal(t, []endpoint.Endpoint{{Addr: "127.0.0.1:8000", Model: "m", Engine: "vllm", MetricsURL: "http://127.0.0.1:8000/metrics",
		KVEvents: "tcp://127.0.0.1:5557", KVReplay: "tcp://127.0.0.1:5558"}}, eps)
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return ln
}
