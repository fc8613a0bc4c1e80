package selector

// slotRuns maps each slot of the ring (see slotOf) to a value, 0 unless
// set, as runs of slots with one value: what a past ring keeps of its
// owners (the slots whose server the ring after it changed, see past) and
// of their gains, and what gains keeps of every slot. A change moves slots
// in a few thousand runs, where a table of every slot takes megabytes (see
// slotTable): 4 bytes a run where the values are below 4096 (a run's first
// slot and its value in one word), 8 beyond. A slotRuns is immutable once
// built: a change builds another (see with), which is published whole.
type slotRuns struct {
	packed  []uint32 // each run's first slot<<packBits | its value, ascending; or
	lo, val []uint32 // each run's first slot, ascending, and its value
	idx     []uint16 // of packed runs, beyond a few: the run of the first slot of each of 2^idxBits parts of the ring, and the last run
	// A run ends where the next begins, the last at the end of the ring;
	// the slots before the first run have 0.
}

// packBits is the bits of a packed run's value: a slot takes slotBits of
// the 32.
const packBits = 32 - slotBits

// idxBits is the parts of the ring a slotRuns indexes (see slotRuns.idx):
// a lookup then searches a few runs (about 20 of a change of 3 servers)
// rather than thousands, for 514 bytes.
const idxBits = 8

// valRun is slots lo to hi, with one value: a change to a slotRuns.
type valRun struct{ lo, hi, v uint32 }

// at returns the value of slot: a binary search, without a branch on the
// comparison (which the CPU would mispredict half the time) and without
// allocating. It is on the read path (see routing.previous and gains.of).
func (m *slotRuns) at(slot uint32) uint32 {
	if p := m.packed; p != nil {
		key := slot<<packBits | (1<<packBits - 1)
		i, n := 0, len(p)
		if m.idx != nil { // the runs of slot's part of the ring, and the next part's first
			b := slot >> (slotBits - idxBits)
			i = int(m.idx[b])
			n = int(m.idx[b+1]) - i + 1
		}
		if p[i] > key {
			return 0
		}
		for n > 1 {
			half := n / 2
			if p[i+half] <= key {
				i += half
			}
			n -= half
		}
		return p[i] & (1<<packBits - 1)
	}
	if i := m.index(slot); i >= 0 {
		return m.val[i]
	}
	return 0
}

// index returns the index of the run of slot, or -1 if slot is before the
// first run.
func (m *slotRuns) index(slot uint32) int {
	n := m.runs()
	if n == 0 || slot < m.first(0) {
		return -1
	}
	i := 0
	for n > 1 {
		half := n / 2
		if m.first(i+half) <= slot {
			i += half
		}
		n -= half
	}
	return i
}

// runs returns how many runs m has.
func (m *slotRuns) runs() int { return len(m.packed) + len(m.lo) }

// first and value return run i's first slot and value.
func (m *slotRuns) first(i int) uint32 {
	if m.packed != nil {
		return m.packed[i] >> packBits
	}
	return m.lo[i]
}

func (m *slotRuns) value(i int) uint32 {
	if m.packed != nil {
		return m.packed[i] & (1<<packBits - 1)
	}
	return m.val[i]
}

// bytes is the memory m takes.
func (m *slotRuns) bytes() int { return 4*(cap(m.packed)+cap(m.lo)+cap(m.val)) + 2*cap(m.idx) }

// each calls f with each run of m with a value other than 0, in slot
// order: its first and last slots and its value.
func (m *slotRuns) each(f func(lo, hi, v uint32)) {
	for i := range m.runs() {
		v := m.value(i)
		if v == 0 {
			continue
		}
		hi := uint32(numSlots - 1)
		if i+1 < m.runs() {
			hi = m.first(i+1) - 1
		}
		f(m.first(i), hi, v)
	}
}

// with returns m with the slots of each run of rs, in slot order and
// disjoint, set to its value; m is not changed. A run that overlaps the
// one before it is ignored.
func (m *slotRuns) with(rs []valRun) slotRuns {
	var b runsBuilder
	b.grow(m.runs() + 2*len(rs))
	next := uint32(0) // the first slot not written yet
	for _, r := range rs {
		if r.lo < next || r.hi < r.lo || r.hi >= numSlots {
			continue
		}
		b.copyFrom(m, next, r.lo)
		b.set(r.lo, r.v)
		next = r.hi + 1
	}
	b.copyFrom(m, next, numSlots)
	return b.done()
}

// mapped returns m with each value v replaced by f(v); f(0) must be 0.
func (m *slotRuns) mapped(f func(uint32) uint32) slotRuns {
	var b runsBuilder
	b.grow(m.runs())
	for i := range m.runs() {
		b.set(m.first(i), f(m.value(i)))
	}
	return b.done()
}

// runsBuilder builds a slotRuns, slot after slot in ascending order.
type runsBuilder struct{ lo, val []uint32 }

func (b *runsBuilder) grow(n int) {
	b.lo, b.val = make([]uint32, 0, n), make([]uint32, 0, n)
}

// set gives slot, and the slots after it until the next set, the value v.
// Slots must come in ascending order; one set again replaces its value.
func (b *runsBuilder) set(slot, v uint32) {
	n := len(b.lo)
	if n > 0 && b.lo[n-1] == slot { // set again
		b.lo, b.val, n = b.lo[:n-1], b.val[:n-1], n-1
	}
	if n == 0 && v == 0 || n > 0 && b.val[n-1] == v {
		return // the run before goes on
	}
	b.lo = append(b.lo, slot)
	b.val = append(b.val, v)
}

// runs returns how many runs b has.
func (b *runsBuilder) runs() int { return len(b.lo) }

// copyFrom sets slots from to to, excluded, to their values in m.
func (b *runsBuilder) copyFrom(m *slotRuns, from, to uint32) {
	if from >= to {
		return
	}
	i := m.index(from)
	if i < 0 {
		b.set(from, 0)
		i = 0
	} else {
		b.set(from, m.value(i))
		i++
	}
	for ; i < m.runs() && m.first(i) < to; i++ {
		b.set(m.first(i), m.value(i))
	}
}

// done returns the runs built, packed where every value fits packBits, in
// slices of their length: a slotRuns outlives its build, a past ring's for
// the handoff window.
func (b *runsBuilder) done() slotRuns {
	defer func() { b.lo, b.val = nil, nil }()
	if len(b.lo) == 0 {
		return slotRuns{}
	}
	for _, v := range b.val {
		if v >= 1<<packBits {
			return slotRuns{lo: append([]uint32(nil), b.lo...), val: append([]uint32(nil), b.val...)}
		}
	}
	p := make([]uint32, len(b.lo))
	for i, lo := range b.lo {
		p[i] = lo<<packBits | b.val[i]
	}
	m := slotRuns{packed: p}
	if len(p) >= 64 && len(p) < 1<<16 {
		m.idx = make([]uint16, 1<<idxBits+1)
		for k := range 1 << idxBits {
			m.idx[k] = uint16(max(m.index(uint32(k)<<(slotBits-idxBits)), 0))
		}
		m.idx[1<<idxBits] = uint16(len(p) - 1)
	}
	return m
}

// runCursor reads a slotRuns slot after slot, at a constant cost a slot
// in ascending order (see gains.record, which walks every slot).
type runCursor struct {
	m *slotRuns
	i int // the run of the last slot read, or -1
}

func newRunCursor(m *slotRuns) runCursor { return runCursor{m: m, i: -1} }

// at returns the value of slot: at a constant cost if it is at or after
// the last one read, else by a search.
func (c *runCursor) at(slot uint32) uint32 {
	m := c.m
	if c.i >= 0 && slot < m.first(c.i) {
		c.i = m.index(slot)
	}
	for c.i+1 < m.runs() && m.first(c.i+1) <= slot {
		c.i++
	}
	if c.i < 0 {
		return 0
	}
	return m.value(c.i)
}
