package quoter

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/omnious/provider-node/capacity"
)

// TestCalibrationFile: a missing, corrupt or foreign calibration is said
// in the log and leaves no calibration (the quote then sells only what
// was measured online); a good one is loaded and re-read when it changes.
func TestCalibrationFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "calibration.json")
	core, logs := observer.New(zap.InfoLevel)
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "loaded"})
	f := &calibrationFile{path: path, model: "m", log: zap.New(core), loaded: gauge}

	write := func(c *capacity.Calibration) {
		w, err := os.Create(path)
		require.NoError(t, err)
		require.NoError(t, c.Write(w))
		require.NoError(t, w.Close())
	}
	good := func(model string, running float64) *capacity.Calibration {
		return &capacity.Calibration{Version: capacity.CalibrationVersion, Model: model, Replicas: 1,
			Objectives: capacity.ObjectivesJSON{TTFTSeconds: 2, ITLSeconds: 0.05, Quantile: 0.95},
			Curve:      curve(curveBin(running, 1, 1, 10*running))}
	}

	require.Nil(t, f.get(), "missing")
	require.Equal(t, 0.0, testutil.ToFloat64(gauge))
	require.Equal(t, 1, logs.FilterMessage("no calibration: quoting only capacity measured online").Len())

	require.NoError(t, os.WriteFile(path, []byte("{not json"), 0o600))
	require.Nil(t, f.get(), "corrupt")
	require.Equal(t, 1, logs.FilterMessage("calibration unusable: quoting only capacity measured online").Len())

	write(good("other", 8))
	// A rewrite within the file system's time resolution is still seen:
	// the size changes too.
	require.Nil(t, f.get(), "another model's")
	require.Equal(t, 2, logs.FilterMessage("calibration unusable: quoting only capacity measured online").Len())

	write(good("m", 8))
	c := f.get()
	require.NotNil(t, c)
	require.Equal(t, 1.0, testutil.ToFloat64(gauge))
	require.Same(t, c, f.get(), "unchanged: not re-read")

	later := time.Now().Add(time.Second)
	write(good("m", 12))
	require.NoError(t, os.Chtimes(path, later, later))
	require.Equal(t, 12.0, f.get().Curve.Bins[0].Running, "changed: re-read")

	// Headroom from that calibration alone: an idle replica with no live
	// curve is quoted from it; without it, nothing is sold.
	m := capacity.Model{ReplicaCapacity: []capacity.Replica{{Addr: "r", Healthy: true, MaxRunning: 256}}}
	obj := Config{}.WithDefaults().Objectives
	h, _ := ComputeHeadroom(m, f.get(), obj)
	require.Positive(t, h.Concurrency)
	h, a := ComputeHeadroom(m, nil, obj)
	require.Zero(t, h)
	require.Contains(t, a.Replicas[0].Why, "no capacity measured")
}
