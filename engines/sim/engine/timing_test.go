package engine

import "time"

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
