package clustertest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/internal/testutil/kubetest"
)

// TestChartAdmitted: every object of every combination check.sh renders is
// admitted by the API server (schema with unknown fields refused, defaults,
// admission) with a server-side dry run, with the CRDs it needs installed.
func TestChartAdmitted(t *testing.T) {
	env := kubetest.Shared(t)
	env.InstallCRDs(t, crds(t)...)
	ctx := context.Background()
	for _, c := range combinations(t) {
		t.Run(c.name, func(t *testing.T) {
			ns := namespace(t, env, c.name)
			manifest := render(t, ns, c.args...)
			want, err := kubetest.Decode(manifest)
			require.NoError(t, err)
			got, err := env.Apply(ctx, manifest, kubetest.ApplyOptions{Namespace: ns, DryRun: true})
			require.NoError(t, err)
			require.Len(t, got, len(want))
			for i, o := range got {
				require.Equal(t, want[i].GetKind(), o.GetKind())
				require.Equal(t, want[i].GetName(), o.GetName())
			}
		})
	}
}
