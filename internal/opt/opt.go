// Package opt holds the repository's one rule for configuration values,
// and the helpers that apply it:
//
//   - Zero means the default. A component has one WithDefaults, which
//     fills every zero field, and one Validate, which runs on the
//     defaulted config.
//   - A setting whose zero is legal (0 retries, 0s warmup) is a pointer in
//     Go configs and YAML: nil is unset and takes the default (Or), so
//     "fallbacks: 0" stays 0. A setting whose zero is never legal stays a
//     plain value and zero means unset (Zero).
//   - A negative value is an error of Validate (or of flag parsing) that
//     names the setting, as its flag or YAML key, and the value
//     (NonNegative, DefaultNonNegative). WithDefaults never turns a
//     negative into the default: Zero and Or keep it for Validate to
//     refuse.
//   - Disabled is an explicit value, documented in the setting's help or
//     comment. For a duration it is a negative value, and its help says
//     "negative: never" (the EPP's idle timeouts); for an address or a
//     file it is the empty string, and its help says "empty: none".
//     Nothing else is disabled by a negative value.
package opt

import (
	"fmt"
	"time"
)

// Or returns a new pointer to *p, or to def when p is nil. The result never
// aliases p, so a defaulted config shares no state with the one it came
// from.
func Or[T any](p *T, def T) *T {
	if p != nil {
		def = *p
	}
	return &def
}

// Zero sets *v to def when *v is the zero value. A negative value is kept,
// for Validate to refuse.
func Zero[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Number is a setting that can be negative.
type Number interface {
	~int | ~int32 | ~int64 | ~float64
}

// NonNegative is nil unless v is negative, and then an error naming the
// setting (its flag or YAML key) and the value. It is for settings whose
// zero is legal; DefaultNonNegative is for those whose zero is the default.
func NonNegative[T Number](name string, v T) error {
	if v >= 0 {
		return nil
	}
	return fmt.Errorf("%s %v is negative; give %s", name, v, zeroOrMore(v))
}

// DefaultNonNegative is nil unless v is negative, and then an error naming
// the setting, the value and the default that zero stands for.
func DefaultNonNegative[T Number](name string, v, def T) error {
	if v >= 0 {
		return nil
	}
	return fmt.Errorf("%s %v is negative; give a positive %s, or 0 for the default (%v)", name, v, kind(v), def)
}

func kind[T Number](v T) string {
	if _, ok := any(v).(time.Duration); ok {
		return "duration"
	}
	return "value"
}

func zeroOrMore[T Number](v T) string {
	if _, ok := any(v).(time.Duration); ok {
		return "0s or a positive duration"
	}
	return "0 or a positive value"
}
