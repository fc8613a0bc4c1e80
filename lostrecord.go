package selector

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// A server's record of the slots it lost (see lostKey): its runs of slots
// with their floors, how two are merged, and its encoding.

// lostRun is a run of slots, lo to hi, and its floor.
type lostRun struct {
	lo, hi uint32
	floor  uint64
}

// lostRecord is a server's record: the floors of the slots it lost, taken
// in the process that started at start (see serverStart).
type lostRecord struct {
	start int64
	runs  []lostRun // in slot order, disjoint
}

// maxLostRuns bounds a record (about 10 bytes a run): beyond it, neighbour
// runs are joined (see coarsen).
const maxLostRuns = 1 << 15

// mergeLost returns the runs of a and b, each in slot order and disjoint,
// with each slot's higher floor: a value below it predates the later loss.
func mergeLost(a, b []lostRun) []lostRun {
	var cuts []uint32 // where a floor may change
	for _, rs := range [][]lostRun{a, b} {
		for _, r := range rs {
			cuts = append(cuts, r.lo, r.hi+1)
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	var out []lostRun
	i, j := 0, 0
	for k := 0; k+1 < len(cuts); k++ {
		lo, hi := cuts[k], cuts[k+1]-1
		for i < len(a) && a[i].hi < lo {
			i++
		}
		for j < len(b) && b[j].hi < lo {
			j++
		}
		var f uint64
		if i < len(a) && a[i].lo <= lo {
			f = a[i].floor
		}
		if j < len(b) && b[j].lo <= lo {
			f = max(f, b[j].floor)
		}
		if f == 0 {
			continue
		}
		if n := len(out); n > 0 && out[n-1].floor == f && out[n-1].hi+1 == lo {
			out[n-1].hi = hi
		} else {
			out = append(out, lostRun{lo, hi, f})
		}
	}
	return coarsen(out)
}

// covers reports whether every slot of want has a floor in have.
func covers(have, want []lostRun) bool {
	one := slices.Clone(want)
	for i := range one {
		one[i].floor = 1 // below every floor: it changes only a slot that has none
	}
	return slices.Equal(mergeLost(have, one), have)
}

// coarsen joins neighbour runs, two by two, until there are at most
// maxLostRuns: a joined run covers the slots between them too, at the
// higher floor, which only keeps more old values from being served.
func coarsen(runs []lostRun) []lostRun {
	for len(runs) > maxLostRuns {
		out := runs[:0]
		for i := 0; i < len(runs); i += 2 {
			r := runs[i]
			if i+1 < len(runs) {
				r.hi, r.floor = runs[i+1].hi, max(r.floor, runs[i+1].floor)
			}
			out = append(out, r)
		}
		runs = out
	}
	return runs
}

// lostVersion starts an encoded record.
const lostVersion = 1

// encode returns r as a record's value: the version, the start, then each
// run as varints: its distance from the end of the one before, its length
// less one, its floor.
func (r lostRecord) encode() []byte {
	b := make([]byte, 0, 16+len(r.runs)*10)
	b = append(b, lostVersion)
	b = binary.AppendVarint(b, r.start)
	b = binary.AppendUvarint(b, uint64(len(r.runs)))
	next := uint32(0)
	for _, x := range r.runs {
		b = binary.AppendUvarint(b, uint64(x.lo-next))
		b = binary.AppendUvarint(b, uint64(x.hi-x.lo))
		b = binary.AppendUvarint(b, x.floor)
		next = x.hi + 1
	}
	return b
}

// decodeLost reads a record's value. Any other application's value under
// lostKey, or a record of another version, is an error.
func decodeLost(b []byte) (lostRecord, error) {
	var r lostRecord
	if len(b) == 0 || b[0] != lostVersion {
		return r, errors.New("not a record of lost slots of this version")
	}
	b = b[1:]
	next := func() (uint64, error) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, errors.New("truncated")
		}
		b = b[n:]
		return v, nil
	}
	start, n := binary.Varint(b)
	if n <= 0 {
		return r, errors.New("truncated start")
	}
	b, r.start = b[n:], start
	count, err := next()
	if err != nil {
		return r, err
	}
	if count > maxLostRuns || count > uint64(len(b)) { // a run takes 3 bytes or more
		return r, fmt.Errorf("%d runs in %d bytes", count, len(b))
	}
	r.runs = make([]lostRun, 0, count)
	at := uint64(0) // the first slot a run may start at
	for range count {
		gap, err1 := next()
		length, err2 := next()
		floor, err3 := next()
		if err := errors.Join(err1, err2, err3); err != nil {
			return r, err
		}
		lo := at + gap
		hi := lo + length
		if gap >= 1<<slotBits || length >= 1<<slotBits || hi >= 1<<slotBits || floor == 0 {
			return r, fmt.Errorf("a run of slots %d to %d, floor %d", lo, hi, floor)
		}
		r.runs = append(r.runs, lostRun{uint32(lo), uint32(hi), floor})
		at = hi + 1
	}
	if len(b) != 0 {
		return r, fmt.Errorf("%d bytes after the runs", len(b))
	}
	return r, nil
}
