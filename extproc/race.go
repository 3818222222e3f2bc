//go:build race

package extproc

// raceEnabled says the race detector is on: it allocates on its own, so
// the allocation tests (allocs_test.go) skip themselves.
const raceEnabled = true
