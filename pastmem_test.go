package selector

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// rollingChange returns the servers of step i (from 1) of a run of changes
// over addrs: a pod added, one removed, one replaced, in turn, starting from
// addrs[:n].
func rollingChange(addrs []string, n, i int) []string {
	lo := i / 3
	switch i % 3 {
	case 1: // added
		return addrs[lo : lo+n+1]
	case 2: // the first removed
		return addrs[lo+1 : lo+n+1]
	}
	// replaced: the servers of step i-1 but its first, and a new one
	return append(append([]string(nil), addrs[lo:lo+n-1]...), addrs[lo+n+1])
}

// TestPastMemory: what a Client over 3 servers holds after a run of changes.
// Its ring, past rings and the gains of their slots take about 2 MB at
// most (10 past rings are kept), as past rings keep only the slots that
// changed owner (with whole rings and a table of gains: 13 MB after 4
// changes, 21 after 20). The heap the Client holds adds its connections
// and, for a while after a change, the records of lost slots being written
// (see lostKey); where the servers do not answer, neither.
func TestPastMemory(t *testing.T) {
	ms := startMemcached(t, 12)
	refuse := WithDialContext(func(context.Context, string, string) (net.Conn, error) { return nil, syscall.ECONNREFUSED })
	for _, tc := range []struct {
		name    string
		changes int
		addrs   []string
		opt     []ClientOption
		bound   uint64
	}{
		{"4 changes", 4, addrsOf(ms), nil, 6 << 20},
		{"20 changes", 20, addrsOf(ms), nil, 6 << 20},
		{"20 changes, servers out", 20, benchAddrs(12), []ClientOption{refuse}, 5 << 19},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c *Client
			build := func() uint64 {
				return retainedBytes(func() any {
					ss := listOf(t, tc.addrs[:3]...)
					var err error
					opt := append([]ClientOption{WithSlog(slog.New(slog.DiscardHandler)), WithMoves(Moves{Rate: -1})}, tc.opt...)
					c, err = NewClientFromList(ss, opt...)
					require.NoError(t, err)
					for i := 1; i <= tc.changes; i++ {
						require.NoError(t, ss.SetServers(rollingChange(tc.addrs, 3, i)...))
						eventually(t, "the client to see the change", func() bool { return c.rt.Load().base == ss.ring.Load() })
					}
					if tc.opt == nil {
						eventually(t, "the new servers to answer", func() bool { return c.rt.Load().live == ss.ring.Load() })
					}
					return ss
				})
			}
			// The least of three: other goroutines of a busy run only add.
			all := build()
			for range 2 {
				if all < tc.bound {
					break
				}
				c.Close()
				c = nil
				all = min(all, build())
			}
			defer c.Close()
			own := pastBytes(c)
			t.Logf("3 servers, %d changes: %d past rings; rings, past rings and gains %.2f MB; heap %.2f MB",
				tc.changes, len(c.rt.Load().past), float64(own)/(1<<20), float64(all)/(1<<20))
			// 1.7 MB after 4 changes and 2.0 MB after 20 (10 past rings
			// kept), measured: the bound leaves room for the gains' runs,
			// whose number varies with the changes' timing.
			require.Less(t, own, 9<<18, "rings, past rings and gains")
			require.Less(t, all, tc.bound, "the heap the Client holds")
		})
	}
}

// pastBytes returns the bytes of c's rings, past rings and gains.
func pastBytes(c *Client) int {
	rt := c.rt.Load()
	n := rt.base.bytes()
	if rt.live != nil && rt.live != rt.base {
		n += rt.live.bytes()
	}
	for _, p := range rt.past {
		n += p.moved.bytes() + p.gains.runs.bytes() + 8*(len(p.owners)+len(p.gains.gains))
		if p.whole != nil {
			n += p.whole.bytes()
		}
	}
	if t := c.gains.table.Load(); t != nil {
		n += t.slots.bytes() + 8*len(t.events)
	}
	return n
}

// TestPastMemoryLarge: the past rings and gains of 1000 servers after a
// run of changes, built as Client.refresh builds them: no more than the
// members' own ring and 2 MB (whole past rings and a table of gains took
// 22.6 MB).
func TestPastMemoryLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 1000-server rings")
	}
	const n = 1000
	ids := podIDs(n + 64)
	var w gainsWorld
	var one uint64
	all := retainedBytes(func() any {
		w.change(t, ids[:n]...)
		one = retainedBytes(func() any { return newRing(canonical(members(ids[:n]...)), DefaultPointsPerServer) })
		for i := 1; i <= 8; i++ {
			w.change(t, rollingChange(ids, n, i)...)
		}
		return &w
	})
	t.Logf("1000 servers, 8 changes: %d past rings, %.2f MB (a ring %.2f MB)", len(w.rt.past), float64(all)/(1<<20), float64(one)/(1<<20))
	// With whole rings, 22.6 MB: a ring and 4 past ones, and 4 MB of gains.
	require.Less(t, all, one*5/4+2<<20, "past rings and gains: 2 MB at most beyond the ring")
}

// pastWorlds are the Client-like runs of changes of the benchmarks below:
// a routing over n servers after the given changes, each one a pod
// replaced.
func pastWorld(tb testing.TB, n, changes int) *gainsWorld {
	ids := podIDs(n + changes + 1)
	w := &gainsWorld{}
	for i := 0; i <= changes; i++ {
		w.change(tb, ids[i:i+n]...)
	}
	return w
}

// BenchmarkPrevious: the lookup of a key's servers in the past rings (a
// handoff's), and of a server's gain of its slot (the gate's), with 4 past
// rings of 3 and 1000 servers.
func BenchmarkPrevious(b *testing.B) {
	for _, n := range []int{3, 1000} {
		w := pastWorld(b, n, 4)
		rt := w.rt
		hs := make([]uint64, 1<<12)
		for i := range hs {
			hs[i] = uint64(i) * 0x9e3779b97f4a7c15
		}
		now := w.now
		b.Run(fmt.Sprintf("previous/servers=%d", n), func(b *testing.B) {
			var buf [8]*server
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				h := hs[i%len(hs)]
				rt.previous(h, nil, now, buf[:0])
			}
		})
		b.Run(fmt.Sprintf("gains.of/servers=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				h := hs[i%len(hs)]
				w.g.of(rt.owner(h), h, rt.past)
			}
		})
		b.Run(fmt.Sprintf("inPast/servers=%d", n), func(b *testing.B) {
			s := rt.liveSrv[0]
			b.ReportAllocs()
			for b.Loop() {
				rt.inPast(s)
			}
		})
	}
}
