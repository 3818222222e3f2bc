package calibration

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/omnious/provider-node/capacity"
)

// WriteTable prints the ladder as the client measured it, and the
// engines' curve read at the objectives.
func WriteTable(w io.Writer, cal *capacity.Calibration) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "concurrency\trequests\terrors\tttft p95\titl p95\toutput tok/s\twithin\t")
	for _, l := range cal.Levels {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%s\t%.1f\t%v\t\n", l.Concurrency, l.Requests, l.Errors,
			seconds(l.TTFTP95Seconds), seconds(l.ITLP95Seconds), l.OutputTokensPerSec, l.Within)
	}
	_ = tw.Flush()
	o := cal.Objectives
	at, err := cal.Curve.At(capacity.Objectives{TTFT: time.Duration(o.TTFTSeconds * float64(time.Second)),
		ITL: time.Duration(o.ITLSeconds * float64(time.Second)), Quantile: o.Quantile})
	if err != nil {
		fmt.Fprintf(w, "engines' curve: %v\n", err)
		return
	}
	fmt.Fprintf(w, "engines' curve (one of %d replicas) at the objectives: concurrency %.1f, %.0f output tok/s (limit %s; largest concurrency measured %.1f)\n",
		cal.Replicas, at.Concurrency, at.OutputTokensPerSec, at.Limit, at.MaxMeasured)
}
