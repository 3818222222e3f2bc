package cli

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestConfigFlag(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, ""},
		{[]string{"-listen", "x"}, ""},
		{[]string{"-config", "a.yaml"}, "a.yaml"},
		{[]string{"--config", "b.yaml", "-x"}, "b.yaml"},
		{[]string{"-v", "--config=c.yaml"}, "c.yaml"},
		{[]string{"-config=d.yaml"}, "d.yaml"},
		{[]string{"-config"}, ""},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, ConfigFlag(tc.args), "%v", tc.args)
	}
}

func TestNewLogger(t *testing.T) {
	_, err := NewLogger("debug")
	require.NoError(t, err)
	_, err = NewLogger("loud")
	require.ErrorContains(t, err, "-log-level")
}
