//go:build !race

package extproc

// raceEnabled says the race detector is on; see race.go.
const raceEnabled = false
