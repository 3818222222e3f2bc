// Package cputime gives benchmarks the process's CPU time. On a shared
// machine wall-clock ns/op includes time the process spent descheduled; CPU
// time per op does not, so the project's benchmarks report both.
package cputime

import (
	"testing"
	"time"
)

// Now returns the process's user+system CPU time, and false where the
// platform cannot tell.
func Now() (time.Duration, bool) {
	ns, ok := now()
	return time.Duration(ns), ok
}

// Clock is Now without the flag: 0 where the platform cannot tell, which
// Report then ignores.
func Clock() time.Duration {
	d, _ := Now()
	return d
}

// Report adds "cpu-ns/op" to b: CPU time since start over ops.
func Report(b *testing.B, start time.Duration, ops int) {
	if end, ok := Now(); ok && ops > 0 {
		b.ReportMetric(float64(end-start)/float64(ops), "cpu-ns/op")
	}
}
