package compare

import (
	"fmt"
	"io"
	"math"
)

// CheckResult is one acceptance criterion.
type CheckResult struct {
	Name string
	OK   bool
	Got  string
}

// Check evaluates the acceptance criteria of policy (the one a routing
// change must keep meeting) against the others in the report: hit rate at
// least minBoundShare of the bound, max/mean request load at most maxLoad,
// no errors, TTFT p90 below every other policy, and (when withThroughput)
// output tokens/s above every other policy.
func (r *Report) Check(policy string, minBoundShare, maxLoad float64, withThroughput bool) ([]CheckResult, error) {
	var me *PolicyResult
	for i := range r.Results {
		if r.Results[i].Policy == policy {
			me = &r.Results[i]
		}
	}
	if me == nil {
		return nil, fmt.Errorf("policy %q is not in the report", policy)
	}
	share := me.HitRate / r.Bound
	out := []CheckResult{
		{Name: fmt.Sprintf("hit rate >= %.0f%% of bound", minBoundShare*100), OK: share >= minBoundShare,
			Got: fmt.Sprintf("%s of %s = %s", fmtPct(me.HitRate), fmtPct(r.Bound), fmtPct(share))},
		{Name: fmt.Sprintf("max/mean load <= %.2f", maxLoad), OK: me.MaxMeanLoad <= maxLoad, Got: fmtNum(me.MaxMeanLoad, 3)},
		{Name: "no errors", OK: me.Errors == 0, Got: fmt.Sprint(me.Errors)},
	}
	for _, o := range r.Results {
		if o.Policy == policy {
			continue
		}
		out = append(out, CheckResult{Name: "TTFT p90 below " + o.Policy, OK: me.TTFTP90 < o.TTFTP90 || (math.IsNaN(o.TTFTP90) && !math.IsNaN(me.TTFTP90)),
			Got: fmtNum(me.TTFTP90, 1) + " vs " + fmtNum(o.TTFTP90, 1) + " ms"})
		if withThroughput {
			out = append(out, CheckResult{Name: "output tok/s above " + o.Policy, OK: me.OutputTokPS > o.OutputTokPS || (math.IsNaN(o.OutputTokPS) && !math.IsNaN(me.OutputTokPS)),
				Got: fmtNum(me.OutputTokPS, 0) + " vs " + fmtNum(o.OutputTokPS, 0)})
		}
	}
	return out, nil
}

// WriteChecks prints each of policy's checks, PASS or FAIL, and fails if
// any did.
func WriteChecks(w io.Writer, policy string, results []CheckResult) error {
	failed := 0
	for _, r := range results {
		verdict := "PASS"
		if !r.OK {
			verdict, failed = "FAIL", failed+1
		}
		fmt.Fprintf(w, "%s  %s: %s\n", verdict, r.Name, r.Got)
	}
	if failed > 0 {
		return fmt.Errorf("%d acceptance checks failed for %s", failed, policy)
	}
	return nil
}
