package selector

import (
	"cmp"
	"slices"
	"sync"
)

// serverLosses is what a Client knows of one server's record of lost slots
// (see lostKey) beyond the record itself: the slots the record still owes,
// and the highest floor it is known to hold.
//
// A server that cannot be written when it loses slots (out for this
// Client, or not answering within the second pass's tries) owes them: they
// are written when it is next reachable, before this Client uses it again
// (Client.recover) and before it routes it slots again (Client.refresh).
// Without that, a Client started after its keys move back would read its
// values from before they left (histcheck unseen-change, on a machine
// starved of CPU).
//
// The highest floor is the fallback of a gain whose own floor cannot be
// taken (see Client.takeFloors): it is below every value written at the
// server since (it was taken before the gain), and above every value of a
// slot from before the server last lost it, as far as this Client knows.
type serverLosses struct {
	mu    sync.Mutex
	owed  []lostRun // floors unused: each is taken as it is written
	floor uint64    // the highest floor noted or read; 0 if none
	start int64     // the process start floor was taken in
	told  bool      // a failure to write the owed runs was logged since the last write
	marks []lostRun // of owed, those lost as a member: marked again once written (see Client.remark)
}

// oweMarks adds runs, owed and lost as a member, to mark again once they
// are written.
func (l *serverLosses) oweMarks(runs []lostRun) {
	if len(runs) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.marks = unionLost(l.marks, runs)
}

// takeMarks returns the runs to mark again, and forgets them.
func (l *serverLosses) takeMarks() []lostRun {
	l.mu.Lock()
	defer l.mu.Unlock()
	runs := l.marks
	l.marks = nil
	return runs
}

// owe adds runs, which s's record does not hold yet.
func (l *serverLosses) owe(runs []lostRun) {
	if len(runs) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.owed = unionLost(l.owed, runs)
}

// takeOwed returns the runs owed, and forgets them: the caller writes
// them, or owes them again.
func (l *serverLosses) takeOwed() []lostRun {
	l.mu.Lock()
	defer l.mu.Unlock()
	runs := l.owed
	l.owed = nil
	return runs
}

// failed reports whether a failure to write the runs owed is to be logged:
// once, until they are written.
func (l *serverLosses) failed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	told := l.told
	l.told = true
	return !told
}

// paid notes that the runs owed were written.
func (l *serverLosses) paid() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.told = false
}

// owes reports whether runs are owed.
func (l *serverLosses) owes() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.owed) > 0
}

// noteFloor notes f, a floor of the record taken in the process that
// started at start: kept if higher, or of a later process (the server
// restarted, and its CAS ids started again from 1).
func (l *serverLosses) noteFloor(start int64, f uint64) {
	if f == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if start > l.start || start == l.start && f > l.floor {
		l.start, l.floor = start, f
	}
}

// lastFloor returns the highest floor noted, and the process start it was
// taken in.
func (l *serverLosses) lastFloor() (start int64, f uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.start, l.floor
}

// unionLost returns the slots of a and b, as runs in slot order, their
// floors unset (1).
func unionLost(a, b []lostRun) []lostRun {
	all := append(slices.Clone(a), b...)
	slices.SortFunc(all, func(x, y lostRun) int { return cmp.Compare(x.lo, y.lo) })
	var out []lostRun
	for _, r := range all {
		if n := len(out); n > 0 && r.lo <= out[n-1].hi+1 {
			out[n-1].hi = max(out[n-1].hi, r.hi)
		} else {
			out = append(out, lostRun{lo: r.lo, hi: r.hi, floor: 1})
		}
	}
	return out
}

// highest returns the highest floor of runs.
func highest(runs []lostRun) (f uint64) {
	for _, r := range runs {
		f = max(f, r.floor)
	}
	return f
}
