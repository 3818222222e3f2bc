package capacity

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReadDispersion(t *testing.T) {
	for _, tc := range []struct {
		name    string
		d, want float64
	}{
		{"a router's narrower spread", 0.5, 0.5},
		{"Poisson", 1, 1},
		{"wider than Poisson: the load changing, read as Poisson", 3, 1},
		{"steadier than a router holds: at least 0.25", 0.1, 0.25},
		{"not measured", 0, 1},
		{"negative", -1, 1},
		{"not a number", math.NaN(), 1},
		{"infinite", math.Inf(1), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, readDispersion(tc.d))
		})
	}
}
