//go:build unix

package scheduler

import (
	"syscall"
	"testing"
	"time"
)

// cpuClock reads the process's user+system CPU time. On a shared machine
// wall-clock ns/op includes time spent descheduled; CPU time does not, so
// the benchmarks report both.
func cpuClock() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportCPU(b *testing.B, start time.Duration, ops int) {
	if ops > 0 {
		b.ReportMetric(float64(cpuClock()-start)/float64(ops), "cpu-ns/op")
	}
}
