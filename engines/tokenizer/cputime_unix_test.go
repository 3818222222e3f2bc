//go:build unix

package tokenizer

import (
	"syscall"
	"time"
)

// processCPU is the CPU time this process has used (all threads, GC
// included). Benchmarks report it beside wall time because the shared
// development machines are often oversubscribed.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
