package ring

import "slices"

// The lookups: a hash to the index of the member that owns it, and to the
// members a key fails over to. They read the slot table, or the Ketama
// continuum or Ch3 positions of an alt ring, and allocate nothing.

// Slot returns the slot of hash h: its top SlotBits bits.
func Slot(h uint64) uint64 { return h >> (64 - slotBits) }

func slotOf(h uint64) uint64 { return Slot(h) }

// SlotOwner returns the index of the member that owns slot s, on the
// library's own ring (not Ketama's or Ch3's): what PickServer reads, one
// read of the table. It is small enough to be inlined, so that a lookup
// through it costs what a read of the table does.
func (r *Ring) SlotOwner(s uint64) uint32 { return r.table.owner(s) }

// Owners returns the index of the member that owns hash h and of its
// successor, the member that would own h if the owner left; with one
// member, both are it.
func (r *Ring) Owners(h uint64) (owner, succ uint32) {
	if r.alt != nil {
		var buf [2]uint32
		c := r.altCandidates(h, 2, buf[:0])
		return c[0], c[len(c)-1]
	}
	return r.table.get(slotOf(h))
}

// Candidates appends to dst the indexes of up to n distinct members for
// hash h, in the order a key of h would fail over: its owner, its successor
// (exactly the owner if the owner left), then the owners and successors of
// the slots after h's, which follow the ring's order more loosely. It
// allocates nothing when dst has room.
func (r *Ring) Candidates(h uint64, n int, dst []uint32) []uint32 {
	if r.alt != nil {
		return r.altCandidates(h, n, dst)
	}
	n = min(n, r.n)
	start := len(dst)
	add := func(m uint32) {
		if len(dst)-start < n && !slices.Contains(dst[start:], m) {
			dst = append(dst, m)
		}
	}
	for s := slotOf(h); len(dst)-start < n; s = (s + 1) % (1 << slotBits) {
		o, next := r.table.get(s)
		add(o)
		add(next)
	}
	return dst
}

// Len returns the number of members.
func (r *Ring) Len() int { return r.n }

// Points returns the points per member of the library's own ring.
func (r *Ring) Points() int { return r.points }

// Shares reports whether r and o share their slot table: one was built
// from the other by With with the same ids, which rebinds no slot.
func (r *Ring) Shares(o *Ring) bool {
	t, u := &r.table, &o.table
	return r.alt == nil && o.alt == nil && len(t.succ.b) > 0 && len(u.succ.b) > 0 && &t.succ.b[0] == &u.succ.b[0]
}

// Owner returns the index of the member that owns hash h.
func (r *Ring) Owner(h uint64) uint32 {
	switch {
	case r.alt == nil:
		return r.table.owner(slotOf(h))
	case r.alt.cont != nil:
		return r.alt.cont.owner(h)
	}
	return r.alt.ch3.owner(h)
}

// altCandidates is Candidates for an alt ring: the owner, then for Ketama
// the members of the points after h's along the continuum (where its keys
// go when the owner is left out, with equal weights exactly), for Ch3 those
// of the tries after the first.
func (r *Ring) altCandidates(h uint64, n int, dst []uint32) []uint32 {
	n = min(n, r.n)
	start := len(dst)
	add := func(m uint32) {
		if len(dst)-start < n && !slices.Contains(dst[start:], m) {
			dst = append(dst, m)
		}
	}
	if c := r.alt.cont; c != nil {
		for i, j := c.at(uint32(h)), 0; j < len(c.value) && len(dst)-start < n; i, j = c.next(i), j+1 {
			add(c.member[i])
		}
		return dst
	}
	c := r.alt.ch3
	add(c.owner(h))
	for i := 1; i <= furcMaxTries && len(dst)-start < n; i++ {
		if m := c.at[c.probe(h, i)]; m >= 0 {
			add(uint32(m))
		}
	}
	for p := 0; p < len(c.at) && len(dst)-start < n; p++ {
		if m := c.at[p]; m >= 0 {
			add(uint32(m))
		}
	}
	return dst
}
