package compare

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/omnious/provider-node/bench/rig"
	"github.com/omnious/provider-node/scheduler"
)

// jsonFloat encodes NaN and infinities as null: JSON has no NaN, and a
// figure that could not be measured must not read as 0.
type jsonFloat float64

func (f jsonFloat) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, v, 'g', -1, 64), nil
}

// UnmarshalJSON reads null as NaN, so that a contract reads back as it
// was written.
func (f *jsonFloat) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*f = jsonFloat(math.NaN())
		return nil
	}
	v, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return fmt.Errorf("not a number: %w", err)
	}
	*f = jsonFloat(v)
	return nil
}

// ContractJSON is the document -json writes, and scripts compare runs by:
// per policy, its requests, errors, TTFT and ITL percentiles, output
// tokens/s, cache-hit rate, max/mean load and decision p99, next to the
// workload's bound hit rate. Its keys and their meaning do not change;
// keys are only added.
type ContractJSON struct {
	Scenario string `json:"scenario"`
	Replicas int    `json:"replicas"`
	// Agents is an agents run's closed-loop agents (absent: open loop,
	// or another workload).
	Agents       int              `json:"agents,omitempty"`
	BoundHitRate jsonFloat        `json:"bound_hit_rate"`
	Results      []ContractResult `json:"results"`
}

// ContractResult is one policy in ContractJSON. max_mean_load is over
// requests per replica; latencies are in model time for simulated fleets.
// kind is how the policy ran (policy, config, exec, addr), epps how many
// EPPs served it side by side (0 for the direct proxy). For an external
// EPP (exec:, addr:) hit rate, TTFT, ITL and throughput are measured by
// the engines and the client as for any policy; decision_p99_us comes from
// its own histogram named by decision_source (null when it exposes none
// the bench knows), and epp_requests is what its request counter grew by
// (null when unknown).
type ContractResult struct {
	Policy        string    `json:"policy"`
	Kind          string    `json:"kind"`
	EPPs          int       `json:"epps"`
	Requests      int       `json:"requests"`
	Errors        int       `json:"errors"`
	TTFTP50ms     jsonFloat `json:"ttft_p50_ms"`
	TTFTP90ms     jsonFloat `json:"ttft_p90_ms"`
	TTFTP99ms     jsonFloat `json:"ttft_p99_ms"`
	ITLP50ms      jsonFloat `json:"itl_p50_ms"`
	ITLP99ms      jsonFloat `json:"itl_p99_ms"`
	OutputTokPS   jsonFloat `json:"output_tok_per_s"`
	HitRate       jsonFloat `json:"hit_rate"`
	MaxMeanLoad   jsonFloat `json:"max_mean_load"`
	DecisionP99us jsonFloat `json:"decision_p99_us"`
	// Replicas has each replica's share, in the fleet's order.
	Replicas []ContractReplica `json:"replicas,omitempty"`
	// External EPPs only.
	DecisionSource *string    `json:"decision_source,omitempty"`
	EPPRequests    *jsonFloat `json:"epp_requests,omitempty"`
	// Agent workloads only (SessionFigures).
	Sessions *ContractSessions `json:"sessions,omitempty"`
}

// ContractSessions is an agent workload's figures of one policy:
// goodput (output tok/s of calls within the TTFT objective), sessions
// started, completed (and per model minute) and refused (429), refused
// calls retried by closed-loop agents, completion time percentiles in
// seconds, the EPPs' session moves and sessions admitted within the KV
// budget (room) and past it (spare_compute) (null: unknown).
type ContractSessions struct {
	GoodputTokPS jsonFloat `json:"goodput_tok_per_s"`
	Started      int       `json:"started"`
	Completed    int       `json:"completed"`
	Refused      int       `json:"refused"`
	Retries      int       `json:"retries"`
	PerMin       jsonFloat `json:"completed_per_min"`
	P50s         jsonFloat `json:"completion_p50_s"`
	P90s         jsonFloat `json:"completion_p90_s"`
	Moves        jsonFloat `json:"moves"`
	Room         jsonFloat `json:"admitted_room"`
	Spare        jsonFloat `json:"admitted_spare_compute"`
}

// ContractReplica is one replica's share of a policy's run, from its own
// counters.
type ContractReplica struct {
	Requests     float64   `json:"requests"`
	PromptTokens float64   `json:"prompt_tokens"`
	HitRate      jsonFloat `json:"hit_rate"`
}

// Contract converts the report to the JSON contract.
func (r *Report) Contract() ContractJSON {
	c := ContractJSON{Scenario: r.Scenario, Replicas: r.Replicas, Agents: r.Agents, BoundHitRate: jsonFloat(r.Bound), Results: []ContractResult{}}
	for _, p := range r.Results {
		cr := ContractResult{Policy: p.Policy, Kind: p.Kind, EPPs: p.EPPs, Requests: p.Requests, Errors: p.Errors,
			TTFTP50ms: jsonFloat(p.TTFTP50), TTFTP90ms: jsonFloat(p.TTFTP90), TTFTP99ms: jsonFloat(p.TTFTP99),
			ITLP50ms: jsonFloat(p.ITLP50), ITLP99ms: jsonFloat(p.ITLP99), OutputTokPS: jsonFloat(p.OutputTokPS),
			HitRate: jsonFloat(p.HitRate), MaxMeanLoad: jsonFloat(p.MaxMeanLoad), DecisionP99us: jsonFloat(p.DecisionP99us)}
		if len(p.LoadPromptTokens) == len(p.LoadRequests) && len(p.LoadHitRate) == len(p.LoadRequests) {
			for i, n := range p.LoadRequests {
				cr.Replicas = append(cr.Replicas, ContractReplica{Requests: n, PromptTokens: p.LoadPromptTokens[i],
					HitRate: jsonFloat(p.LoadHitRate[i])})
			}
		}
		if f := p.Sessions; f != nil {
			cr.Sessions = &ContractSessions{GoodputTokPS: jsonFloat(f.GoodputTokPS), Started: f.Sessions, Completed: f.Completed,
				Refused: f.Refused, Retries: f.Retries, PerMin: jsonFloat(f.CompletedPerMin), P50s: jsonFloat(f.CompletionP50), P90s: jsonFloat(f.CompletionP90), Moves: jsonFloat(f.Moves),
				Room: jsonFloat(f.AdmittedRoom), Spare: jsonFloat(f.AdmittedSpare)}
		}
		if p.EPP != nil {
			src, n := p.EPP.DecisionHistogram, jsonFloat(p.EPP.Requests)
			cr.DecisionSource, cr.EPPRequests = &src, &n
		}
		c.Results = append(c.Results, cr)
	}
	return c
}

// WriteJSON writes the contract document to path.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r.Contract(), "", "  ")
	if err != nil {
		return fmt.Errorf("cannot encode report: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("cannot write report: %w", err)
	}
	return nil
}

func fmtNum(v float64, prec int) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

func fmtPct(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "-"
	}
	return fmtNum(v*100, 1) + "%"
}

// tableRows are the comparison table's rows: a name and a cell per policy.
func (r *Report) tableRows() [][]string {
	unit := "ms"
	if r.Simulated {
		unit = "ms (model)"
	}
	type row struct {
		name string
		f    func(p PolicyResult) string
	}
	rows := []row{
		{"kind", func(p PolicyResult) string { return p.Kind }},
		{"EPPs", func(p PolicyResult) string { return strconv.Itoa(p.EPPs) }},
		{"requests", func(p PolicyResult) string { return strconv.Itoa(p.Requests) }},
		{"errors", func(p PolicyResult) string { return strconv.Itoa(p.Errors) }},
		{"TTFT p50 " + unit, func(p PolicyResult) string { return fmtNum(p.TTFTP50, 1) }},
		{"TTFT p90 " + unit, func(p PolicyResult) string { return fmtNum(p.TTFTP90, 1) }},
		{"TTFT p99 " + unit, func(p PolicyResult) string { return fmtNum(p.TTFTP99, 1) }},
		{"ITL p50 " + unit, func(p PolicyResult) string { return fmtNum(p.ITLP50, 2) }},
		{"ITL p99 " + unit, func(p PolicyResult) string { return fmtNum(p.ITLP99, 2) }},
		{"e2e p50 " + unit, func(p PolicyResult) string { return fmtNum(p.E2EP50, 0) }},
		{"e2e p99 " + unit, func(p PolicyResult) string { return fmtNum(p.E2EP99, 0) }},
		{"output tok/s", func(p PolicyResult) string { return fmtNum(p.OutputTokPS, 0) }},
		{"hit rate (engines)", func(p PolicyResult) string { return fmtPct(p.HitRate) }},
		{"hit rate / bound", func(p PolicyResult) string { return fmtPct(p.HitRate / r.Bound) }},
		{"hit rate / fleet bound", func(p PolicyResult) string { return fmtPct(p.HitRate / r.FleetBound) }},
		{"cached (usage)", func(p PolicyResult) string { return fmtPct(p.UsageCachedShare) }},
		{"max/mean requests", func(p PolicyResult) string { return fmtNum(p.MaxMeanLoad, 2) }},
		{"max/mean prompt tok", func(p PolicyResult) string { return fmtNum(p.MaxMeanPromptLoad, 2) }},
		{"decision p99 us", func(p PolicyResult) string { return fmtNum(p.DecisionP99us, 0) }},
	}
	if len(r.Results) > 0 && r.Results[0].Sessions != nil {
		sess := func(f func(*SessionFigures) string) func(PolicyResult) string {
			return func(p PolicyResult) string {
				if p.Sessions == nil {
					return "-"
				}
				return f(p.Sessions)
			}
		}
		rows = append(rows,
			row{"goodput tok/s (TTFT <= " + GoodputTTFT.String() + ")", sess(func(f *SessionFigures) string { return fmtNum(f.GoodputTokPS, 0) })},
			row{"sessions done / started", sess(func(f *SessionFigures) string { return fmt.Sprintf("%d / %d", f.Completed, f.Sessions) })},
			row{"sessions done / min", sess(func(f *SessionFigures) string { return fmtNum(f.CompletedPerMin, 1) })},
			row{"sessions refused (429)", sess(func(f *SessionFigures) string { return strconv.Itoa(f.Refused) })},
			row{"refused calls retried", sess(func(f *SessionFigures) string { return strconv.Itoa(f.Retries) })},
			row{"session time p50 s", sess(func(f *SessionFigures) string { return fmtNum(f.CompletionP50, 1) })},
			row{"session time p90 s", sess(func(f *SessionFigures) string { return fmtNum(f.CompletionP90, 1) })},
			row{"session moves", sess(func(f *SessionFigures) string { return fmtNum(f.Moves, 0) })},
			row{"admitted: room / spare compute", sess(func(f *SessionFigures) string {
				return fmtNum(f.AdmittedRoom, 0) + " / " + fmtNum(f.AdmittedSpare, 0)
			})},
		)
	}
	out := [][]string{append([]string{"policy"}, r.policyNames()...)}
	for _, rw := range rows {
		line := []string{rw.name}
		for _, p := range r.Results {
			line = append(line, rw.f(p))
		}
		out = append(out, line)
	}
	return out
}

// The ladder's rows: a stage's TTFT p90 and output tok/s, the run's and a
// published run's alike.
const (
	stageFigures = ": TTFT p90 / tok/s"
	acrossLabel  = "across stages" + stageFigures
)

func stageLabel(st StageResult) string {
	name := "QPS " + fmtNum(st.QPS, 1)
	if st.Warmup {
		name += " (warm-up)"
	}
	return name + stageFigures
}

func stageCell(ttftMs, tokPS float64) string { return fmtNum(ttftMs, 0) + " / " + fmtNum(tokPS, 0) }

// publishedRows put the published run's stages under each policy's
// column, output tok/s in the run's tokens; none when the scenario
// reproduces no publication or no policy has a published counterpart.
func (r *Report) publishedRows() [][]string {
	pub := r.Published
	var cols []PublishedPolicy
	found := false
	for _, p := range r.Results {
		pp, ok := pub.policy(p.Policy)
		cols = append(cols, pp)
		found = found || ok
	}
	if !found {
		return nil
	}
	cell := func(pp PublishedPolicy, s StageResult) string {
		if pp.Name == "" {
			return "-"
		}
		return stageCell(s.TTFTP90ms, s.OutputTokPS*pub.TokenScale)
	}
	head := []string{fmt.Sprintf("published (%s; tok/s x %g)", pub.Source, pub.TokenScale)}
	for _, pp := range cols {
		head = append(head, cmp.Or(pp.Name, "-"))
	}
	rows := [][]string{head}
	k := 0
	for _, st := range r.Results[0].Stages {
		if st.Warmup {
			continue
		}
		row := []string{stageLabel(st)}
		for _, pp := range cols {
			if k < len(pp.Stages) && pp.Stages[k].QPS == st.QPS {
				row = append(row, cell(pp, pp.Stages[k]))
			} else {
				row = append(row, "-")
			}
		}
		rows = append(rows, row)
		k++
	}
	row := []string{acrossLabel}
	for _, pp := range cols {
		row = append(row, cell(pp, StageResult{TTFTP90ms: pp.Summary.TTFTP90ms, OutputTokPS: pp.Summary.OutputTokPS}))
	}
	return append(rows, row)
}

// ratioNote compares each policy's output tok/s across stages with
// random's, beside the published ratio: the shape a reproduction must
// match when absolute figures cannot.
func (r *Report) ratioNote() string {
	var base *PolicyResult
	for i := range r.Results {
		if r.Results[i].Policy == scheduler.PolicyRandom {
			base = &r.Results[i]
		}
	}
	pubBase, ok := r.Published.policy(scheduler.PolicyRandom)
	if base == nil || !ok || !(base.AcrossStages.OutputTokPS > 0) {
		return ""
	}
	var parts []string
	for _, p := range r.Results {
		pp, ok := r.Published.policy(p.Policy)
		if p.Policy == base.Policy || !ok {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.2f (published %.2f)", p.Policy,
			p.AcrossStages.OutputTokPS/base.AcrossStages.OutputTokPS, pp.Summary.OutputTokPS/pubBase.Summary.OutputTokPS))
	}
	if len(parts) == 0 {
		return ""
	}
	return "output tok/s across stages over random's: " + strings.Join(parts, ", ")
}

// notes are the lines under the table: each policy's first error and
// warning, what is known about each external EPP, and the throughput
// ratios beside a published run's.
func (r *Report) notes() []string {
	var out []string
	if n := r.ratioNote(); n != "" {
		out = append(out, n)
	}
	for _, p := range r.Results {
		if p.FirstError != "" {
			out = append(out, p.Policy+": first error: "+p.FirstError)
		}
		if p.Warning != "" {
			out = append(out, p.Policy+": WARNING: "+p.Warning)
		}
		if p.EPP != nil {
			out = append(out, p.Policy+": "+describeEPP(p.EPP))
		}
	}
	return out
}

// describeEPP says what the bench knows about an external EPP's run.
func describeEPP(e *rig.EPPInfo) string {
	parts := []string{"external EPP on " + e.Addr + " (hit rate, latencies and throughput measured by the engines and the client)"}
	if e.Log != "" {
		parts = append(parts, "output in "+e.Log)
	}
	if e.KVEventsBind != "" {
		parts = append(parts, fmt.Sprintf("%d KV-event batches relayed to its socket %s", e.KVBatchesRelayed, e.KVEventsBind))
	}
	switch {
	case e.MetricsURL == "":
		parts = append(parts, "metrics not known (name {metrics_addr} or {metrics_port} in the command)")
	case e.MetricsError != "":
		parts = append(parts, "metrics at "+e.MetricsURL+" could not be read: "+e.MetricsError)
	default:
		if e.RequestsCounter != "" {
			parts = append(parts, fmt.Sprintf("%s requests counted by its %s", fmtNum(e.Requests, 0), e.RequestsCounter))
		}
		if e.DecisionHistogram != "" {
			parts = append(parts, "decision latencies from its "+e.DecisionHistogram+" histogram (interpolated within buckets)")
		} else {
			parts = append(parts, "no decision-latency histogram the bench knows at "+e.MetricsURL)
		}
	}
	return strings.Join(parts, "; ")
}

func (r *Report) policyNames() []string {
	var n []string
	for _, p := range r.Results {
		n = append(n, p.Policy)
	}
	return n
}

// WriteTable prints the comparison: one column per policy.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "scenario %s: %s\n", r.Scenario, r.Workload)
	timeNote := "latencies in wall time"
	if r.Simulated {
		timeNote = fmt.Sprintf("latencies and tok/s in model time (wall x time scale %g)", r.TimeScale)
	}
	fmt.Fprintf(w, "%d replicas, %d requests per policy, bound hit rate %s (infinite cache), %s (fleet KV as one LRU cache); %s\n",
		r.Replicas, r.Requests, fmtPct(r.Bound), fmtPct(r.FleetBound), timeNote)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, row := range r.tableRows() {
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	if len(r.Results) > 0 && len(r.Results[0].Stages) > 1 {
		// The ladder: TTFT p90 and throughput per QPS stage.
		for k, st := range r.Results[0].Stages {
			line := []string{stageLabel(st)}
			for _, p := range r.Results {
				if k < len(p.Stages) {
					line = append(line, stageCell(p.Stages[k].TTFTP90ms, p.Stages[k].OutputTokPS))
				}
			}
			fmt.Fprintln(tw, strings.Join(line, "\t")+"\t")
		}
		line := []string{acrossLabel}
		for _, p := range r.Results {
			line = append(line, stageCell(p.AcrossStages.TTFTP90ms, p.AcrossStages.OutputTokPS))
		}
		fmt.Fprintln(tw, strings.Join(line, "\t")+"\t")
		for _, row := range r.publishedRows() {
			fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range r.notes() {
		fmt.Fprintln(w, n)
	}
	if r.Sweep != nil {
		fmt.Fprintf(w, "Pareto front (TTFT p90 vs output tok/s): %s\n", strings.Join(r.Sweep.frontLabels(r), "; "))
	}
	return nil
}
