// Package opt fills config defaults. A field whose zero value is a legal
// setting is a pointer, nil meaning unset, so that "fallbacks: 0" stays 0;
// a field whose zero is never legal stays a plain value and zero means
// unset.
package opt

// Or returns a new pointer to *p, or to def when p is nil. The result never
// aliases p, so a defaulted config shares no state with the one it came
// from.
func Or[T any](p *T, def T) *T {
	if p != nil {
		def = *p
	}
	return &def
}

// Zero sets *v to def when *v is the zero value.
func Zero[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}
