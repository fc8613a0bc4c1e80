// Package quality is the file that the selector package's TestQualityMeasure
// writes with -quality-json and internal/benchreport reads to write
// BENCHMARKS.md: the ring's routing-quality figures, which only the
// package's tests can measure exactly, with the scenarios they were measured
// on, so that the report measures other schemes on the same changes.
//
// All fractions are of the key space.
package quality

// Figures is the whole file.
type Figures struct {
	Points   int        // points per member: DefaultPointsPerServer
	PickKeys PickKeys   // the keys of the PickServer benchmarks
	Balance  []Balance  // at the default points, then at other points for contrast
	MoveGoal float64    // moved/ideal must stay within [1/MoveGoal, MoveGoal], on average at each size
	Movement []Movement // one per size
	Restart  []Restart  // one per size
	Seconds  float64    // how long the measurements took
}

// PickKeys describes the keys the PickServer benchmarks cycle through.
type PickKeys struct {
	Count   int
	Example string
}

// Balance is the exact key-space balance of Sets random rings of N members.
type Balance struct {
	N, Points, Sets int
	Peak, WorstPeak float64 // the busiest member's share over the mean share: mean over the sets, and worst
	Low, WorstLow   float64 // the least busy member's, likewise
	Goal            float64 // the limit on Peak, or 0 if there is none
}

// Movement is what changes of one member did to rings of N members at the
// default points.
type Movement struct {
	N           int
	Sets        []Set
	Add, Remove Stats
}

// Set is a list of members, in the order they were discovered, and the
// changes made to it one at a time: the removal of each Removed index, and
// the addition of each Added member at the end of the list.
type Set struct {
	Members []string
	Removed []int
	Added   []string
}

// Restart is what restarts of one StatefulSet pod with a new IP did at N
// pods: each restart is of Pods with one pod at a new IP.
type Restart struct {
	N        int
	Pods     []Pod
	Restarts []PodRestart
	Ours     Stats // hostname identity, through ServerList.update
	RingByIP Stats // a ring keyed by ip:port
}

// Pod is a StatefulSet pod: a stable hostname, a changing IP.
type Pod struct{ Host, IP string }

// PodRestart is pod Pods[Pod] restarted at IP.
type PodRestart struct {
	Pod int
	IP  string
}

// Stats aggregates the fractions of the keys that changes moved.
type Stats struct {
	Count      int
	Sum, Worst float64 // of the moved fractions
	Needless   float64 // the most moved between two servers present before and after a change
}

// Add adds a change that moved a fraction of the keys, needless of them
// between servers present before and after it.
func (s *Stats) Add(moved, needless float64) {
	s.Count++
	s.Sum += moved
	s.Worst = max(s.Worst, moved)
	s.Needless = max(s.Needless, needless)
}

// Mean returns the mean moved fraction.
func (s Stats) Mean() float64 { return s.Sum / float64(s.Count) }
