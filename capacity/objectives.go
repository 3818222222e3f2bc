package capacity

import (
	"errors"
	"fmt"
	"time"
)

// Objectives are latency objectives at a quantile.
type Objectives struct {
	// TTFT and ITL bound time to first token and inter-token latency.
	// Zero means the default: 2s and 50ms.
	TTFT, ITL time.Duration
	// Quantile is the share of observations that must be within them.
	// Zero means the default, 0.95 (p95 objectives).
	Quantile float64
}

// DefaultObjectives are interactive chat's: p95 time to first token 2s and
// p95 inter-token latency 50ms. Every component that takes objectives
// defaults them here (TestObjectivesDefaults).
var DefaultObjectives = Objectives{TTFT: 2 * time.Second, ITL: 50 * time.Millisecond, Quantile: 0.95}

// WithDefaults returns o with each zero field at DefaultObjectives'.
func (o Objectives) WithDefaults() Objectives {
	if o.TTFT == 0 {
		o.TTFT = DefaultObjectives.TTFT
	}
	if o.ITL == 0 {
		o.ITL = DefaultObjectives.ITL
	}
	if o.Quantile == 0 {
		o.Quantile = DefaultObjectives.Quantile
	}
	return o
}

// Validate refuses a negative objective and a quantile outside (0, 1) of
// defaulted objectives.
func (o Objectives) Validate() error {
	var errs []error
	if o.TTFT < 0 {
		errs = append(errs, fmt.Errorf("TTFT objective %v is negative", o.TTFT))
	}
	if o.ITL < 0 {
		errs = append(errs, fmt.Errorf("ITL objective %v is negative", o.ITL))
	}
	if !(o.Quantile > 0 && o.Quantile < 1) {
		errs = append(errs, fmt.Errorf("objective quantile %v is not in (0, 1)", o.Quantile))
	}
	return errors.Join(errs...)
}
