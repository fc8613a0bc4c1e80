//go:build race

package meta

// raceEnabled: the race detector makes sync.Pool drop items at random, so
// allocation counts vary run to run.
const raceEnabled = true
