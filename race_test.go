//go:build race

package selector

// raceEnabled: the race detector makes sync.Pool drop items at random, so
// that allocation counts through fmt or gomemcache vary run to run.
const raceEnabled = true
