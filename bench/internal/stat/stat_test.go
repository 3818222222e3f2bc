package stat

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPercentile(t *testing.T) {
	tests := []struct {
		vals []float64
		p    float64
		want float64
	}{
		{[]float64{1, 2, 3, 4}, 50, 2.5},
		{[]float64{1, 2, 3, 4}, 0, 1},
		{[]float64{1, 2, 3, 4}, 100, 4},
		{[]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 90, 10},
		{[]float64{10, 20}, 99, 19.9},
		{[]float64{7}, 99, 7},
	}
	for _, tc := range tests {
		require.InDelta(t, tc.want, Percentile(tc.vals, tc.p), 1e-9, "p%v of %v", tc.p, tc.vals)
	}
	require.True(t, math.IsNaN(Percentile(nil, 50)))
	require.Equal(t, []float64{2, 4}, SortedMillis([]time.Duration{2 * time.Millisecond, time.Millisecond}, 2))
}
