package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// plainTiming is Timing with the coefficients as values, for the tests
// that compute expected step times from them.
type plainTiming struct {
	PrefillBase, PrefillPerToken, DecodeBase, DecodePerSeq, KVTerm, CPULoadPerToken time.Duration
}

// timing is p as a Timing.
func (p plainTiming) timing() Timing {
	return Timing{PrefillBase: &p.PrefillBase, PrefillPerToken: &p.PrefillPerToken, DecodeBase: &p.DecodeBase,
		DecodePerSeq: &p.DecodePerSeq, KVTerm: &p.KVTerm, CPULoadPerToken: &p.CPULoadPerToken}
}

// plain is a defaulted Timing's coefficients.
func plain(t Timing) plainTiming {
	return plainTiming{*t.PrefillBase, *t.PrefillPerToken, *t.DecodeBase, *t.DecodePerSeq, *t.KVTerm, *t.CPULoadPerToken}
}

// roundTiming has round coefficients, so that expected step times read
// plainly.
var roundTiming = plainTiming{
	PrefillBase:     2 * time.Millisecond,
	PrefillPerToken: 100 * time.Microsecond,
	DecodeBase:      10 * time.Millisecond,
	DecodePerSeq:    time.Millisecond,
	KVTerm:          20 * time.Millisecond,
	CPULoadPerToken: time.Microsecond,
}

func TestStepTime(t *testing.T) {
	ti := roundTiming
	for _, c := range []struct {
		name            string
		prefill, decode int
		occupancy       float64
		cpuLoad         int
		want            time.Duration
	}{
		{"idle", 0, 0, 0, 0, 0},
		{"prefill alone", 100, 0, 0.5, 0, 12 * time.Millisecond},
		{"decode alone", 0, 4, 0.5, 0, 10*time.Millisecond + 4*time.Millisecond + 10*time.Millisecond},
		// 2ms + 50 x 100µs = 7ms of prefill fits in the 10ms weight read.
		{"a short chunk rides on the decodes' read", 50, 4, 0.5, 0, 10*time.Millisecond + 4*time.Millisecond + 10*time.Millisecond},
		// 2ms + 500 x 100µs = 52ms of prefill hides the read.
		{"decodes ride on a long chunk", 500, 4, 0.5, 0, 52*time.Millisecond + 4*time.Millisecond + 10*time.Millisecond},
		{"loads from the CPU tier", 100, 0, 0, 1000, 12*time.Millisecond + time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, ti.timing().StepTime(c.prefill, c.decode, c.occupancy, c.cpuLoad))
		})
	}
}
