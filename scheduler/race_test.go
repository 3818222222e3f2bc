//go:build race

package scheduler

// raceEnabled says the race detector is on: it allocates on its own, so
// TestAllocsPick skips itself.
const raceEnabled = true
