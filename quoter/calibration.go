package quoter

import (
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/capacity"
)

// calibrationFile is the calibration the quote loop reads, re-read when
// the file's modification time or size changes (a ConfigMap volume is
// updated by swapping a symlink, which changes both). A missing or bad file
// is logged once per change and leaves no calibration: the quoter then
// sells only what the replicas measured online.
type calibrationFile struct {
	path   string
	model  string
	log    *zap.Logger
	loaded prometheus.Gauge

	mu    sync.Mutex
	mtime time.Time
	size  int64
	seen  bool
	cal   *capacity.Calibration
}

func (f *calibrationFile) get() *capacity.Calibration {
	if f.path == "" {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	fi, err := os.Stat(f.path)
	if err != nil {
		if !f.seen || f.cal != nil || !f.mtime.IsZero() {
			f.log.Warn("no calibration: quoting only capacity measured online", zap.String("file", f.path), zap.Error(err))
		}
		f.seen, f.cal, f.mtime, f.size = true, nil, time.Time{}, 0
		f.loaded.Set(0)
		return nil
	}
	if f.seen && fi.ModTime().Equal(f.mtime) && fi.Size() == f.size {
		return f.cal
	}
	f.seen, f.mtime, f.size = true, fi.ModTime(), fi.Size()
	c, err := capacity.LoadCalibration(f.path)
	if err == nil && c.Model != f.model {
		err = fmt.Errorf("calibration is for model %q, not %q", c.Model, f.model)
	}
	if err != nil {
		f.log.Error("calibration unusable: quoting only capacity measured online", zap.String("file", f.path), zap.Error(err))
		f.cal = nil
		f.loaded.Set(0)
		return nil
	}
	f.log.Info("calibration loaded", zap.String("file", f.path), zap.String("url", c.URL),
		zap.Time("taken", c.Taken), zap.Int("replicas", c.Replicas), zap.Int("levels", len(c.Levels)))
	f.cal = c
	f.loaded.Set(1)
	return c
}
