package histcheck

import (
	"math"
	"slices"
	"strconv"
	"time"
)

// StaleRead is a read that Check found stale, with the writes that prove
// it: W1 wrote the value read, and W2 began after W1 ended and was
// acknowledged before the read began.
type StaleRead struct {
	Read   Event
	W1, W2 Event
	Rule   string // "producer" or "lineage" (see the package doc)
}

// Result is what Check found in a history.
type Result struct {
	Reads int // values asked for: Gets, each key of a GetMulti, and the reads of Increments that found their key
	Hits  int
	Stale []StaleRead
	// Unknown counts reads of a value that no operation of the history
	// wrote: a checker or workload bug, or a value from another run.
	Unknown int
}

// unknownEnd is the end of a write whose end is unknown: it failed, so
// it may take effect at any time.
const unknownEnd = time.Duration(math.MaxInt64)

// counterBits is where a counter's lineage starts: a Set of a counter
// writes its write id << counterBits.
const counterBits = 32

// keyWrites are the acknowledged writes of one key, by start, with the
// minimum end of every suffix, so that "is there a write that began after
// a and ended before b" is one binary search in the common case.
type keyWrites struct {
	w      []Event
	minEnd []time.Duration // minEnd[i] = min(w[i:].End)
}

func newKeyWrites(w []Event) *keyWrites {
	slices.SortFunc(w, func(a, b Event) int { return cmpDur(a.Start, b.Start) })
	kw := &keyWrites{w: w, minEnd: make([]time.Duration, len(w)+1)}
	kw.minEnd[len(w)] = unknownEnd
	for i := len(w) - 1; i >= 0; i-- {
		kw.minEnd[i] = min(kw.minEnd[i+1], w[i].End)
	}
	return kw
}

// find returns an admissible write that began after a and ended before b.
func (kw *keyWrites) find(a, b time.Duration, admissible func(Event) bool) (Event, bool) {
	i, _ := slices.BinarySearchFunc(kw.w, a, func(e Event, t time.Duration) int {
		if e.Start <= t {
			return -1
		}
		return 1
	})
	if kw.minEnd[i] >= b { // the common case: none at all
		return Event{}, false
	}
	for ; i < len(kw.w) && kw.w[i].Start < b; i++ {
		if kw.w[i].End < b && admissible(kw.w[i]) {
			return kw.w[i], true
		}
	}
	return Event{}, false
}

// Check returns the stale reads of a history (see the package doc for the
// rule). It is a pure function of the events, in any order.
func Check(h []Event) Result {
	type vkey struct{ key, value string }
	producers := map[vkey][]Event{} // what may have written each value
	lineageSet := map[vkey]Event{}  // a counter's Set, by key and lineage
	writes := map[string][]Event{}
	dbKeys := map[string]bool{}
	var flushes []Event
	for _, e := range h {
		if e.DB {
			dbKeys[e.Key] = true
		}
		switch {
		case e.Kind == Flush:
			if e.OK {
				flushes = append(flushes, e)
			}
		case e.Kind == Write:
			producers[vkey{e.Key, e.Value}] = append(producers[vkey{e.Key, e.Value}], e)
			if e.Counter {
				if v, err := strconv.ParseUint(e.Value, 10, 64); err == nil {
					lineageSet[vkey{e.Key, strconv.FormatUint(v>>counterBits, 10)}] = e
				}
			}
			if e.OK {
				writes[e.Key] = append(writes[e.Key], e)
			}
		case e.Kind == Delete:
			if e.OK {
				writes[e.Key] = append(writes[e.Key], e)
			}
		case e.Kind == Incr && e.OK && e.Found:
			producers[vkey{e.Key, e.Value}] = append(producers[vkey{e.Key, e.Value}], e)
			writes[e.Key] = append(writes[e.Key], e)
		}
	}
	idx := map[string]*keyWrites{}
	index := func(key string) *keyWrites {
		kw := idx[key]
		if kw == nil {
			w := writes[key]
			if !dbKeys[key] { // a flush empties the cache, not the database that loads read
				w = append(w, flushes...)
			}
			kw = newKeyWrites(w)
			idx[key] = kw
		}
		return kw
	}

	var res Result
	check := func(r Event, value string) {
		res.Reads++
		res.Hits++
		ps := producers[vkey{r.Key, value}]
		var lin uint64
		var n uint64
		if r.Counter {
			v, err := strconv.ParseUint(value, 10, 64)
			if err != nil {
				res.Unknown++
				return
			}
			lin, n = v>>counterBits, v&(1<<counterBits-1)
			if _, ok := lineageSet[vkey{r.Key, strconv.FormatUint(lin, 10)}]; !ok {
				res.Unknown++
				return
			}
			if n != 0 { // only Increments produce it: the Set wrote another number
				ps = slices.DeleteFunc(slices.Clone(ps), func(e Event) bool { return e.Kind == Write })
			}
		} else if len(ps) == 0 {
			res.Unknown++
			return
		}
		kw := index(r.Key)

		// The producer rule.
		w1, end := Event{}, time.Duration(-1)
		for _, p := range ps {
			if !p.OK && !p.Abandoned {
				end = unknownEnd
				break
			}
			if p.End > end {
				w1, end = p, p.End
			}
		}
		if len(ps) > 0 && end != unknownEnd {
			if w2, ok := kw.find(end, r.Start, func(w Event) bool {
				if !r.Counter || w.Kind != Incr {
					return true
				}
				x, _ := strconv.ParseUint(w.Value, 10, 64)
				return x>>counterBits != lin || x&(1<<counterBits-1) > n
			}); ok {
				res.Stale = append(res.Stale, StaleRead{Read: withValue(r, value), W1: w1, W2: w2, Rule: "producer"})
				return
			}
		}

		// The lineage rule.
		if !r.Counter {
			return
		}
		set := lineageSet[vkey{r.Key, strconv.FormatUint(lin, 10)}]
		if !set.OK {
			return
		}
		if w2, ok := kw.find(set.End, r.Start, func(w Event) bool {
			switch w.Kind {
			case Delete, Flush:
				return true
			}
			x, _ := strconv.ParseUint(w.Value, 10, 64)
			return x>>counterBits != lin
		}); ok {
			res.Stale = append(res.Stale, StaleRead{Read: withValue(r, value), W1: set, W2: w2, Rule: "lineage"})
		}
	}
	for _, e := range h {
		switch {
		case e.Kind == Read && e.Found:
			check(e, e.Value)
		case e.Kind == Read:
			res.Reads++
		case e.Kind == Incr && e.OK && e.Found:
			x, err := strconv.ParseUint(e.Value, 10, 64)
			if err != nil || x&(1<<counterBits-1) == 0 {
				res.Reads++
				res.Unknown++
				continue
			}
			check(e, strconv.FormatUint(x-1, 10)) // it read the number before its own
		case e.Kind == Incr && e.OK:
			res.Reads++ // a miss
		}
	}
	slices.SortFunc(res.Stale, func(a, b StaleRead) int { return cmpDur(a.Read.Start, b.Read.Start) })
	return res
}

// withValue returns r with the value it read, which for an Increment is
// the number before the one it returned.
func withValue(r Event, v string) Event {
	if r.Kind == Incr {
		r.Value = v + " (then " + r.Value + ")"
	}
	return r
}

func cmpDur(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
