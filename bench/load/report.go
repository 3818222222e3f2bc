package load

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// Step is one measured rate.
type Step struct {
	Rate    float64 `json:"offered_per_s"`
	Seconds float64 `json:"seconds"`
	OK      int     `json:"ok"`
	Errors  int     `json:"errors"`
	Dropped int     `json:"dropped"`
	// Decisions is successful routed requests per second.
	Decisions float64 `json:"decisions_per_s"`
	// EPPCores is the EPP process's CPU time over wall time; PerEPPCore
	// is decisions per EPP CPU-second.
	EPPCores   float64 `json:"epp_cores"`
	PerEPPCore float64 `json:"decisions_per_epp_cpu_s"`
	// BenchCores is this process's CPU (load generator, test gateway,
	// stubs) over wall time; HostCores the whole machine's busy CPU.
	BenchCores float64 `json:"bench_cores"`
	HostCores  float64 `json:"host_busy_cores"`
	// Added latency (ms): the time the gateway waited on the EPP for the
	// request (testgw.Timing.Request + Response).
	AddedP50 float64 `json:"added_p50_ms"`
	AddedP99 float64 `json:"added_p99_ms"`
	// RouteP50 and RouteP99 (ms) are the EPP's own share of the added
	// latency, from its omnious_extproc_route_duration_seconds histogram
	// (interpolated within buckets); zero for the floor server.
	RouteP50 float64 `json:"epp_route_p50_ms,omitempty"`
	RouteP99 float64 `json:"epp_route_p99_ms,omitempty"`
	// RequestP99 is the request-path part alone; E2E is the client's
	// whole request through gateway, EPP and stub.
	RequestP99 float64 `json:"request_path_p99_ms"`
	// CoresPerReq is EPPCores over Decisions: the EPP's cores per
	// request a second, the sizing unit. ApplyLagP99 (ms) is the p99 of
	// the EPP's KV-event apply lag over the step, from its
	// omnious_epp_kv_event_apply_lag_seconds histogram (0: no events).
	CoresPerReq float64 `json:"epp_cores_per_req_s"`
	ApplyLagP99 float64 `json:"kv_apply_lag_p99_ms,omitempty"`
	E2EP50      float64 `json:"e2e_p50_ms"`
	E2EP99      float64 `json:"e2e_p99_ms"`
	Pass        bool    `json:"pass"`
	Why         string  `json:"why,omitempty"`
}

// MemSample is one soak sample of the EPP's memory, with what the machine
// did since the previous sample (to tell a stall of the EPP from a machine
// taken by other work).
type MemSample struct {
	At        float64 `json:"at_s"`
	Heap      float64 `json:"heap_inuse_bytes"`
	RSS       float64 `json:"rss_bytes"`
	InFlight  int64   `json:"in_flight"`
	EPPCores  float64 `json:"epp_cores"`
	HostCores float64 `json:"host_busy_cores"`
}

// MemTrend summarises one memory series after the warm-up.
type MemTrend struct {
	First, Last, Max float64
	// SlopePerMin is the least-squares slope of every sample in bytes per
	// minute, and Growth that slope over the measured span.
	SlopePerMin float64
	Growth      float64
	// FloorGrowth is the same fit over the floor of the series (the
	// minimum of each tenth of the samples, at least 3): a leak raises the floor,
	// while a transient backlog (a burst of buffered requests when the
	// machine stalls, memory the runtime returns to the OS minutes later)
	// only raises the peaks. The verdict uses it.
	FloorGrowth float64
}

// SoakResult is a soak's outcome.
type SoakResult struct {
	Load      Step        `json:"load"`
	Samples   []MemSample `json:"samples"`
	Warmup    float64     `json:"warmup_s"`
	Heap      MemTrend    `json:"heap"`
	RSS       MemTrend    `json:"rss"`
	MaxGrowth float64     `json:"max_growth_bytes"`
	// ErrorBudget is the largest share of failed or dropped requests.
	ErrorBudget float64 `json:"error_budget"`
	// MemoryPass is the memory verdict alone; Pass also needs the load
	// held within the error budget.
	MemoryPass bool   `json:"memory_pass"`
	Pass       bool   `json:"pass"`
	Why        string `json:"why,omitempty"`
}

// Report is the outcome of `bench load`.
type Report struct {
	// Floor: a no-op ext_proc server stood in for the EPP.
	Floor        bool    `json:"floor,omitempty"`
	Policy       string  `json:"policy"`
	Tokenizer    string  `json:"tokenizer"`
	Replicas     int     `json:"replicas"`
	PromptBytes  int     `json:"prompt_bytes"`
	PromptTokens int     `json:"prompt_tokens"`
	CPUs         int     `json:"cpus"`
	IndexBlocks  int     `json:"index_blocks"`
	Unique       bool    `json:"unique_prompts,omitempty"`
	EventRate    float64 `json:"kv_event_batches_per_s_per_replica,omitempty"`
	// IdleCores is the EPP's CPU with the fleet connected and no traffic
	// (Options.Idle); PeakRSS its peak resident set over the run, bytes.
	IdleCores float64 `json:"idle_epp_cores,omitempty"`
	PeakRSS   int64   `json:"peak_rss_bytes,omitempty"`
	BudgetP99 float64 `json:"budget_p99_ms"`
	Steps     []Step  `json:"steps,omitempty"`
	// Sustained is the fastest step within budget (nil: none).
	Sustained *Step       `json:"sustained,omitempty"`
	Soak      *SoakResult `json:"soak,omitempty"`
	// EPPDecisions is the EPP's own count of routed requests over the run,
	// a cross-check of the client's.
	EPPDecisions float64 `json:"epp_decisions"`
	ClientOK     int     `json:"client_ok"`
}

// WriteTable prints the report.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	if r.Floor {
		fmt.Fprintf(&b, "FLOOR: a no-op ext_proc server in the EPP's place (EPP columns are its), %d stub replicas, %d-byte chat prompts, %d CPUs\n",
			r.Replicas, r.PromptBytes, r.CPUs)
	} else {
		fmt.Fprintf(&b, "EPP %s policy, %s tokenizer, %d stub replicas, %d-byte chat prompts (%d tokens), %d CPUs, index %d blocks\n",
			r.Policy, r.Tokenizer, r.Replicas, r.PromptBytes, r.PromptTokens, r.CPUs, r.IndexBlocks)
	}
	if len(r.Steps) > 0 {
		b.WriteString("| offered/s | decisions/s | EPP cores | decisions/EPP-CPU-s | bench cores | host busy cores | added p50 ms | added p99 ms | EPP's own p50 / p99 ms | e2e p99 ms | errors | dropped | within budget |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, s := range r.Steps {
			verdict := "yes"
			if !s.Pass {
				verdict = "no: " + s.Why
			}
			own := "-"
			if s.RouteP50 > 0 {
				own = fmt.Sprintf("%.3f / %.3f", s.RouteP50, s.RouteP99)
			}
			fmt.Fprintf(&b, "| %.0f | %.0f | %.2f | %.0f | %.2f | %.2f | %.3f | %.3f | %s | %.2f | %d | %d | %s |\n",
				s.Rate, s.Decisions, s.EPPCores, s.PerEPPCore, s.BenchCores, s.HostCores, s.AddedP50, s.AddedP99, own, s.E2EP99, s.Errors, s.Dropped, verdict)
		}
		if s := r.Sustained; s != nil {
			fmt.Fprintf(&b, "sustained: %.0f decisions/s (%.0f per machine core, %.0f per EPP CPU-second) with p99 added %.3f ms (budget %.3f ms)\n",
				s.Decisions, s.Decisions/float64(r.CPUs), s.PerEPPCore, s.AddedP99, r.BudgetP99)
		} else {
			fmt.Fprintf(&b, "sustained: no rate within budget (p99 added <= %.3f ms)\n", r.BudgetP99)
		}
	}
	if s := r.Soak; s != nil {
		l := s.Load
		fmt.Fprintf(&b, "soak: %.0f s at %.0f/s: %.0f decisions/s, EPP %.2f cores, added p50 %.3f ms p99 %.3f ms, errors %d, dropped %d\n",
			l.Seconds, l.Rate, l.Decisions, l.EPPCores, l.AddedP50, l.AddedP99, l.Errors, l.Dropped)
		mib := func(v float64) float64 { return v / (1 << 20) }
		for _, m := range []struct {
			name string
			t    MemTrend
		}{{"heap in use", s.Heap}, {"RSS", s.RSS}} {
			fmt.Fprintf(&b, "soak %s after %.1f s warm-up: first %.1f MiB, last %.1f MiB, max %.1f MiB, slope %+.3f MiB/min, fit growth %+.1f MiB, floor fit growth %+.1f MiB (limit %.0f MiB)\n",
				m.name, s.Warmup, mib(m.t.First), mib(m.t.Last), mib(m.t.Max), mib(m.t.SlopePerMin), mib(m.t.Growth), mib(m.t.FloorGrowth), mib(s.MaxGrowth))
		}
		verdict := "PASS"
		if !s.Pass {
			verdict = "FAIL: " + s.Why
		}
		memory := "PASS"
		if !s.MemoryPass {
			memory = "FAIL"
		}
		fmt.Fprintf(&b, "soak: memory %s; overall %s\n", memory, verdict)
	}
	if !r.Floor {
		fmt.Fprintf(&b, "EPP decisions %.0f, client successes %d\n", r.EPPDecisions, r.ClientOK)
		r.writeSizing(&b)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeSizing prints the sizing units (llm-d's: cores and GiB at a stated
// request rate), one line per step.
func (r *Report) writeSizing(b *strings.Builder) {
	prefixes := "repeated prefixes"
	if r.Unique {
		prefixes = "no repeated prefixes"
	}
	fmt.Fprintf(b, "sizing: %d pods, %d-token prompts, %s, %s tokenizer, KV events %.0f batches/s a pod; idle %.3f cores; peak RSS %.2f GiB\n",
		r.Replicas, r.PromptTokens, prefixes, r.Tokenizer, r.EventRate, r.IdleCores, float64(r.PeakRSS)/(1<<30))
	for _, s := range r.Steps {
		fmt.Fprintf(b, "sizing: %.1f req/s: EPP %.3f cores, %.4f cores per req/s; decision p50 %.2f ms p99 %.2f ms; KV apply lag p99 %.1f ms\n",
			s.Decisions, s.EPPCores, s.CoresPerReq, s.RouteP50, s.RouteP99, s.ApplyLagP99)
	}
}

// WriteJSON writes the report to path.
func (r *Report) WriteJSON(path string) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("cannot encode the load report: %w", err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("cannot write the load report: %w", err)
	}
	return nil
}
