package ring

import (
	"cmp"
	"slices"
	"strings"
)

// A ring of Ketama or Ch3 is a Ring whose alt is set: the other client's
// structure in place of the slot table, read by the same lookups.
type altRing struct {
	cont *continuum // Ketama
	ch3  *ch3Ring   // Ch3
}

// NewKetama returns the Ketama ring of servers with the given names and
// weights (0 counts as 1), where rank orders the servers among equal
// points (see newContinuum and KetamaRanks); member i is names[i]. It
// returns nil for no names.
func NewKetama(names []string, weights []uint32, rank []int) *Ring {
	if len(names) == 0 {
		return nil
	}
	return &Ring{n: len(names), alt: &altRing{cont: newContinuum(names, weights, rank)}}
}

// NewCh3 returns the Ch3 ring that places member i at position pos[i] of
// mcrouter's order, with holes where no member is; positions are distinct
// and below MaxMembers. It returns nil for no positions.
func NewCh3(pos []int) *Ring {
	if len(pos) == 0 {
		return nil
	}
	return &Ring{n: len(pos), alt: &altRing{ch3: newCh3(pos)}}
}

// KetamaRanks returns the rank of each of the servers named names among
// equal points (see newContinuum) where they have no list order, as for
// discovered servers: as twemproxy ranks its servers whatever its
// configuration's order, by the name it hashes (see KetamaHost), shorter
// first, then byte by byte (conf_validate_server in nc_conf.c sorts its
// servers with string_compare, and keeps them so). Servers given in a list
// rank in its order instead, as libmemcached and php-memcached keep the
// list they are given.
func KetamaRanks(names []string) []int {
	rank := make([]int, len(names))
	hosts := make([]string, len(names))
	byName := make([]int, len(names))
	for i, name := range names {
		hosts[i], byName[i] = KetamaHost(name), i
	}
	slices.SortStableFunc(byName, func(a, b int) int {
		return cmp.Or(cmp.Compare(len(hosts[a]), len(hosts[b])), strings.Compare(hosts[a], hosts[b]))
	})
	for r, i := range byName {
		rank[i] = r
	}
	return rank
}
