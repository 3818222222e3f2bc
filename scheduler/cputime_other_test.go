//go:build !unix

package scheduler

import (
	"testing"
	"time"
)

func cpuClock() time.Duration                              { return 0 }
func reportCPU(b *testing.B, start time.Duration, ops int) {}
