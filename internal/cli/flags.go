package cli

import (
	"errors"
	"flag"
	"fmt"
	"regexp"
	"time"
)

var (
	// zeroHelp finds what a flag's help says 0 means: "(0: 256 MiB)".
	zeroHelp = regexp.MustCompile(`(?:^|[ (;])0s?: ([^);]*)`)
	// negativeHelp is a help that gives negative values a meaning:
	// "(negative: never)".
	negativeHelp = regexp.MustCompile(`(?:^|[ (;])negative: `)
)

// NonNegative refuses every numeric flag of fs set on the command line to
// a negative value, unless its help says what negative means ("negative:
// never"), following package opt's rule. The error names each flag and its
// value, and repeats what its help says 0 means.
func NonNegative(fs *flag.FlagSet) error {
	var errs []error
	fs.Visit(func(f *flag.Flag) {
		g, ok := f.Value.(flag.Getter)
		if !ok || NegativeDocumented(f.Usage) {
			return
		}
		var negative bool
		switch v := g.Get().(type) {
		case time.Duration:
			negative = v < 0
		case int:
			negative = v < 0
		case int64:
			negative = v < 0
		case float64:
			negative = v < 0
		}
		if !negative {
			return
		}
		err := fmt.Sprintf("-%s %s is negative; give a positive value", f.Name, f.Value)
		if zero, ok := ZeroDocumented(f.Usage); ok {
			err += ", or 0 (" + zero + ")"
		}
		errs = append(errs, errors.New(err))
	})
	return errors.Join(errs...)
}

// ZeroDocumented returns what a flag's help says 0 means ("(0: 256 MiB)"
// gives "256 MiB"), and whether it says so. Package opt's rule wants every
// numeric flag's help to; conftest.Flags checks it with this function.
func ZeroDocumented(usage string) (string, bool) {
	m := zeroHelp.FindStringSubmatch(usage)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// NegativeDocumented reports whether a flag's help gives negative values a
// meaning ("(negative: never)"), so that NonNegative leaves them be.
func NegativeDocumented(usage string) bool { return negativeHelp.MatchString(usage) }
