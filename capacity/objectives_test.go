package capacity

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestObjectivesDefaults(t *testing.T) {
	tests := []struct {
		name    string
		in      Objectives
		want    Objectives
		wantErr string
	}{
		{"zero is the default", Objectives{}, DefaultObjectives, ""},
		{"set fields kept", Objectives{TTFT: time.Second, Quantile: 0.99},
			Objectives{TTFT: time.Second, ITL: 50 * time.Millisecond, Quantile: 0.99}, ""},
		{"negative refused", Objectives{ITL: -time.Millisecond},
			Objectives{TTFT: 2 * time.Second, ITL: -time.Millisecond, Quantile: 0.95}, "ITL objective -1ms is negative"},
		{"quantile past one refused", Objectives{Quantile: 1.5},
			Objectives{TTFT: 2 * time.Second, ITL: 50 * time.Millisecond, Quantile: 1.5}, "not in (0, 1)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.in.WithDefaults()
			require.Equal(t, tt.want, got)
			if tt.wantErr == "" {
				require.NoError(t, got.Validate())
			} else {
				require.ErrorContains(t, got.Validate(), tt.wantErr)
			}
		})
	}
}
