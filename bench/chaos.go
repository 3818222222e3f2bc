package bench

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"

	"go.uber.org/zap"
)

// ChaosOptions configures the chaos suite (bench chaos).
type ChaosOptions struct {
	// EnginesimBin is the enginesim binary (a path, or a name on PATH).
	EnginesimBin string
	// Scenarios are the names to run; empty runs every one, in order.
	Scenarios []string
	// Log receives the components' logs.
	Log *zap.Logger
	// Progress, when set, gets one line as each scenario starts and ends.
	Progress io.Writer
}

// ChaosResult is one scenario's verdict.
type ChaosResult struct {
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

// chaosOutcome is what a scenario's run reports; failed lists the
// expectations that did not hold (empty: pass).
type chaosOutcome struct {
	observed   []string
	failed     []string
	recovery   time.Duration
	recoveryOf string
}

func (o *chaosOutcome) see(format string, args ...any) {
	o.observed = append(o.observed, fmt.Sprintf(format, args...))
}

// check records an expectation: when ok is false it fails the scenario
// with the message.
func (o *chaosOutcome) check(ok bool, format string, args ...any) {
	if !ok {
		o.failed = append(o.failed, fmt.Sprintf(format, args...))
	}
}

type chaosScenario struct {
	name     string
	expected string
	setup    chaosSetup
	run      func(ctx context.Context, env *chaosEnv, o *chaosOutcome) error
}

// ChaosScenarios are the scenario names, in the order the suite runs them.
func ChaosScenarios() []string {
	var out []string
	for _, s := range chaosScenarios() {
		out = append(out, s.name)
	}
	return out
}

// RunChaos runs the selected scenarios, each against a fresh fleet of
// enginesim processes with its own EPP and gateway, and returns one result
// per scenario. An error means the suite could not run (unknown scenario,
// no enginesim); a scenario that failed is a result with Pass false.
func RunChaos(ctx context.Context, o ChaosOptions) ([]ChaosResult, error) {
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	bin, err := exec.LookPath(o.EnginesimBin)
	if err != nil {
		return nil, fmt.Errorf("cannot find enginesim binary %q (run make build, or pass its path): %w", o.EnginesimBin, err)
	}
	all := chaosScenarios()
	run := all
	if len(o.Scenarios) > 0 {
		run = nil
		byName := map[string]chaosScenario{}
		for _, s := range all {
			byName[s.name] = s
		}
		for _, n := range o.Scenarios {
			s, ok := byName[n]
			if !ok {
				return nil, fmt.Errorf("unknown chaos scenario %q (have %s)", n, strings.Join(ChaosScenarios(), ", "))
			}
			run = append(run, s)
		}
	}
	var results []ChaosResult
	for _, s := range run {
		if ctx.Err() != nil {
			return results, ctx.Err()
		}
		fmt.Fprintf(o.Progress, "chaos: %s ...\n", s.name)
		r := runChaosScenario(ctx, bin, s, o.Log.With(zap.String("scenario", s.name)))
		verdict := "PASS"
		if !r.Pass {
			verdict = "FAIL"
		}
		fmt.Fprintf(o.Progress, "chaos: %s %s in %s\n", s.name, verdict, r.Took.Round(100*time.Millisecond))
		results = append(results, r)
	}
	return results, nil
}

func runChaosScenario(ctx context.Context, bin string, s chaosScenario, log *zap.Logger) ChaosResult {
	start := time.Now()
	r := ChaosResult{Scenario: s.name, Expected: s.expected}
	var o chaosOutcome
	env, err := newChaosEnv(ctx, bin, s.setup, log)
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

// ChaosPassed reports whether every result passed.
func ChaosPassed(results []ChaosResult) bool {
	for _, r := range results {
		if !r.Pass {
			return false
		}
	}
	return len(results) > 0
}

// WriteChaosTable writes the results as a Markdown table: scenario,
// expected, observed, pass/fail, recovery time.
func WriteChaosTable(w io.Writer, results []ChaosResult) error {
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
