// Package chaos owns the fault-injection suite (bench chaos): scripted
// faults (an engine killed mid-stream or idle, restarted, dropped KV
// events, a vanished KV-event publisher, hanging metrics, every replica
// stale, the EPP restarted under load, one of two EPPs killed, both
// rolled, flapping health under the quoter) against a fresh world per
// scenario: enginesim processes, the real EPP in this process (or two
// bin/epp processes side by side) and the test gateway, all on 127.0.0.1
// (bench/internal/launch). Each scenario checks its expected outcome and
// measures a recovery time; the suite reports expected against observed as
// a table.
//
// It imports the EPP's assembly through launch, the quoter (quoter-flap
// runs quoter.Service in process) and the scheduler's state names.
package chaos

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/bench/internal/launch"
)

// Options configures the suite.
type Options struct {
	// EnginesimBin is the enginesim binary (a path, or a name on PATH).
	EnginesimBin string
	// EPPBin is the EPP binary for the scenarios that run EPP processes
	// (a path, or a name on PATH). Default: epp next to EnginesimBin, as
	// make build leaves them in bin/.
	EPPBin string
	// Scenarios are the names to run; empty runs every one, in order.
	Scenarios []string
	// Log receives the components' logs.
	Log *zap.Logger
	// Progress, when set, gets one line as each scenario starts and ends.
	Progress io.Writer
	// AdminToken makes every EPP's admin port ask for a bearer token (a
	// random one in the scenario's directory, admin.token_file), which
	// siblings (warm start), the quoter and the suite's own reads present.
	AdminToken bool
}

// Result is one scenario's verdict.
type Result struct {
	Scenario string
	// Expected is the outcome the scenario checks; Observed what it saw.
	Expected, Observed string
	Pass               bool
	// Recovery is the scenario's headline recovery time, and RecoveryOf
	// says from what to what it is measured.
	Recovery   time.Duration
	RecoveryOf string
	// Took is the scenario's wall time, set-up included.
	Took time.Duration
}

// outcome is what a scenario's run reports; failed lists the expectations
// that did not hold (empty: pass).
type outcome struct {
	observed   []string
	failed     []string
	recovery   time.Duration
	recoveryOf string
}

func (o *outcome) see(format string, args ...any) {
	o.observed = append(o.observed, fmt.Sprintf(format, args...))
}

// check records an expectation: when ok is false it fails the scenario
// with the message.
func (o *outcome) check(ok bool, format string, args ...any) {
	if !ok {
		o.failed = append(o.failed, fmt.Sprintf(format, args...))
	}
}

type scenario struct {
	name     string
	expected string
	setup    setup
	run      func(ctx context.Context, env *world, o *outcome) error
}

// Scenarios are the scenario names, in the order the suite runs them.
func Scenarios() []string {
	var out []string
	for _, s := range scenarios() {
		out = append(out, s.name)
	}
	return out
}

// Run runs the selected scenarios, each against a fresh fleet of enginesim
// processes with its own EPP and gateway, and returns one result per
// scenario. An error means the suite could not run (unknown scenario, no
// enginesim); a scenario that failed is a result with Pass false.
func Run(ctx context.Context, o Options) ([]Result, error) {
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	b := bins{adminToken: o.AdminToken}
	var err error
	if b.enginesim, err = launch.FindEnginesim(o.EnginesimBin); err != nil {
		return nil, err
	}
	all := scenarios()
	run := all
	if len(o.Scenarios) > 0 {
		run = nil
		byName := map[string]scenario{}
		for _, s := range all {
			byName[s.name] = s
		}
		for _, n := range o.Scenarios {
			s, ok := byName[n]
			if !ok {
				return nil, fmt.Errorf("unknown chaos scenario %q (have %s)", n, strings.Join(Scenarios(), ", "))
			}
			run = append(run, s)
		}
	}
	for _, s := range run {
		if s.setup.eppProcesses > 0 && b.epp == "" {
			if b.epp, err = findEPP(o.EPPBin, b.enginesim); err != nil {
				return nil, err
			}
		}
	}
	var results []Result
	for _, s := range run {
		if ctx.Err() != nil {
			return results, ctx.Err()
		}
		fmt.Fprintf(o.Progress, "chaos: %s ...\n", s.name)
		r := runScenario(ctx, b, s, o.Log.With(zap.String("scenario", s.name)))
		verdict := "PASS"
		if !r.Pass {
			verdict = "FAIL"
		}
		fmt.Fprintf(o.Progress, "chaos: %s %s in %s\n", s.name, verdict, r.Took.Round(100*time.Millisecond))
		results = append(results, r)
	}
	return results, nil
}

// findEPP resolves the EPP binary: bin, or epp next to enginesim.
func findEPP(bin, enginesim string) (string, error) {
	if bin == "" {
		bin = filepath.Join(filepath.Dir(enginesim), "epp")
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return "", fmt.Errorf("cannot find the EPP binary %q (run make build, or pass its path): %w", bin, err)
	}
	return path, nil
}

func runScenario(ctx context.Context, b bins, s scenario, log *zap.Logger) Result {
	start := time.Now()
	r := Result{Scenario: s.name, Expected: s.expected}
	var o outcome
	env, err := newWorld(ctx, b, s.setup, log)
	if err == nil {
		err = s.run(ctx, env, &o)
		if cerr := env.Close(); cerr != nil {
			// Every process must stop; one that did not is a failure.
			o.check(false, "clean shut-down: %v", cerr)
		}
	}
	if err != nil {
		o.check(false, "error: %v", err)
	}
	r.Observed = strings.Join(o.observed, "; ")
	if len(o.failed) > 0 {
		r.Observed = strings.TrimPrefix(r.Observed+"; FAILED: "+strings.Join(o.failed, "; "), "; ")
	}
	r.Pass = len(o.failed) == 0
	r.Recovery, r.RecoveryOf = o.recovery, o.recoveryOf
	r.Took = time.Since(start)
	log.Info("chaos scenario done", zap.Bool("pass", r.Pass), zap.Duration("recovery", r.Recovery),
		zap.String("observed", r.Observed), zap.Duration("took", r.Took))
	return r
}

// Passed reports whether every result passed.
func Passed(results []Result) bool {
	for _, r := range results {
		if !r.Pass {
			return false
		}
	}
	return len(results) > 0
}

// WriteTable writes the results as a Markdown table: scenario, expected,
// observed, pass/fail, recovery time.
func WriteTable(w io.Writer, results []Result) error {
	var b strings.Builder
	b.WriteString("| scenario | expected | observed | result | recovery |\n|---|---|---|---|---|\n")
	for _, r := range results {
		verdict := "pass"
		if !r.Pass {
			verdict = "**FAIL**"
		}
		rec := "-"
		if r.RecoveryOf != "" {
			rec = fmt.Sprintf("%s (%s)", fmtRecovery(r.Recovery), r.RecoveryOf)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", r.Scenario, cell(r.Expected), cell(r.Observed), verdict, cell(rec))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func fmtRecovery(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%d ms", d.Milliseconds())
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

// cell keeps a table cell on one line.
func cell(s string) string {
	return strings.NewReplacer("|", "/", "\n", " ").Replace(s)
}
