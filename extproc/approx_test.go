package extproc

import (
	"fmt"
	"testing"

	"github.com/omnious/provider-node/internal/label"
	"github.com/stretchr/testify/require"
)

func TestFirstApproxOncePerModelAndBounded(t *testing.T) {
	s := &Server{approxModels: label.NewSet(maxApproxModels, "")}
	require.True(t, s.firstApprox("m1"), "first request of an unknown model is reported")
	require.False(t, s.firstApprox("m1"), "and only once")
	require.True(t, s.firstApprox("m2"))
	for i := 0; i < 2*maxApproxModels; i++ {
		s.firstApprox(fmt.Sprintf("client-chosen-%d", i))
	}
	require.EqualValues(t, maxApproxModels, s.approxModels.Len(), "client-chosen names cannot grow the set without bound")
	require.False(t, s.firstApprox("one-more"))
}
