package opt

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOr(t *testing.T) {
	require.Equal(t, 7, *Or[int](nil, 7), "nil takes the default")
	zero := 0
	got := Or(&zero, 7)
	require.Equal(t, 0, *got, "an explicit zero is kept")
	require.NotSame(t, &zero, got, "the result does not alias its input")
}

func TestZero(t *testing.T) {
	tests := []struct {
		name    string
		in, def string
		want    string
	}{
		{"unset", "", "d", "d"},
		{"set", "x", "d", "x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := tt.in
			Zero(&v, tt.def)
			require.Equal(t, tt.want, v)
		})
	}
}
