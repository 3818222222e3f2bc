package compare

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/bench/internal/promtext"
	"github.com/omnious/provider-node/bench/rig"
	"github.com/omnious/provider-node/endpoint"
)

// decisionsTarget reads every EPP's decision counter just before the
// target closes, when the run is over and the EPPs still answer.
type decisionsTarget struct {
	*rig.EPPTarget
	decided *[]float64
}

func (t decisionsTarget) Close() error {
	var pages []func() (io.Reader, error)
	for _, e := range t.EPPs() {
		pages = append(pages, func() (io.Reader, error) { return e.Metrics(context.Background()) })
	}
	n, err := readCounter(pages, "omnious_epp_decisions_total")
	*t.decided = n
	return errors.Join(err, t.EPPTarget.Close())
}

// readCounter reads counter name from each metrics page.
func readCounter(pages []func() (io.Reader, error), name string) ([]float64, error) {
	var out []float64
	for _, page := range pages {
		r, err := page()
		if err != nil {
			return out, err
		}
		sums, _, err := promtext.Sum(r, name)
		if err != nil {
			return out, err
		}
		out = append(out, sums[0])
	}
	return out, nil
}

// TestSeveralEPPsServeOnePool: with Options.EPPs 2 each built-in policy is
// served by two EPPs behind the one gateway, both route a share of the
// requests, every request is decided once, and the report says how many
// EPPs served.
func TestSeveralEPPsServeOnePool(t *testing.T) {
	o := raceOptions(t)
	o.Policies = []string{"precise", "approximate"}
	o.EPPs = 2
	var decided [][]float64
	inner := rig.EPPLauncher(o.Log, rig.ExternalOptions{})
	launch := func(ctx context.Context, policy string, fleet []endpoint.Endpoint, epps int) (rig.Target, error) {
		tg, err := inner(ctx, policy, fleet, epps)
		if err != nil {
			return nil, err
		}
		decided = append(decided, nil)
		return decisionsTarget{EPPTarget: tg.(*rig.EPPTarget), decided: &decided[len(decided)-1]}, nil
	}
	rep, err := Run(context.Background(), o, launch)
	require.NoError(t, err)
	require.Len(t, decided, 2)
	for i, pr := range rep.Results {
		require.Zero(t, pr.Errors, pr.FirstError)
		require.Equal(t, 2, pr.EPPs, pr.Policy)
		require.Equal(t, 2, rep.Contract().Results[i].EPPs)
		require.Len(t, decided[i], 2)
		for _, n := range decided[i] {
			require.Positive(t, n, "%s: each EPP routes a share: %v", pr.Policy, decided[i])
		}
		require.InDelta(t, float64(rep.Requests), decided[i][0]+decided[i][1], 0, "every request decided once")
	}
}

func TestEPPsValidated(t *testing.T) {
	for _, n := range []int{-1, maxEPPs + 1} {
		o := smallOptions(t).WithDefaults()
		o.EPPs = n
		require.ErrorContains(t, o.Validate(), "epps")
	}
	require.Equal(t, 1, Options{}.WithDefaults().EPPs)
}
