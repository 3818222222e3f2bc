package isotonic

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFits(t *testing.T) {
	for _, tc := range []struct {
		name string
		fit  func(v, w []float64)
		v, w []float64
		want []float64
	}{
		{"non-increasing pools a rise", NonIncreasing, []float64{5, 3, 4, 1}, []float64{1, 1, 1, 1}, []float64{5, 3.5, 3.5, 1}},
		{"non-increasing weighs the pool", NonIncreasing, []float64{3, 6}, []float64{2, 1}, []float64{4, 4}},
		{"non-decreasing pools a dip", NonDecreasing, []float64{1, 3, 2, 5}, []float64{1, 1, 1, 1}, []float64{1, 2.5, 2.5, 5}},
		{"unimodal keeps a rise and a fall", Unimodal, []float64{1, 3, 6, 4, 2}, []float64{1, 1, 1, 1, 1}, []float64{1, 3, 6, 4, 2}},
		{"unimodal pools a dip before the peak", Unimodal, []float64{1, 4, 3, 8, 5, 6},
			[]float64{1, 1, 1, 1, 1, 1}, []float64{1, 3.5, 3.5, 8, 5.5, 5.5}},
		{"unimodal of a rise is the rise", Unimodal, []float64{1, 2, 3}, []float64{1, 1, 1}, []float64{1, 2, 3}},
		{"unimodal of one point", Unimodal, []float64{7}, []float64{1}, []float64{7}},
		{"unimodal of nothing", Unimodal, []float64{}, []float64{}, []float64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := append([]float64{}, tc.v...)
			tc.fit(v, tc.w)
			require.InDeltaSlice(t, tc.want, v, 1e-12)
		})
	}
}
