package selector

// Benchmarks for make bench: PickServer against gomemcache's ServerList in
// the same run, and ring rebuilds. internal/benchreport turns their output
// into the tables of BENCHMARKS.md.

import (
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"
)

// benchKeys is a fixed set of realistic cache keys, 20-25 bytes long,
// cycled by the PickServer benchmarks. There are 64k of them, so that the
// lookup structure is not all in L1 and L2, as it would be for a few
// thousand keys (a 30 MB ring looks cheap with 4096). Its length is a power
// of two so that cycling costs a mask, not a division.
var benchKeys = benchKeySet(rand.New(rand.NewPCG(1, 2)), 1<<16)

const benchKeyMask = 1<<16 - 1

// benchKeySet returns n keys of the shapes applications use.
func benchKeySet(rng *rand.Rand, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		switch i % 4 {
		case 0:
			keys[i] = fmt.Sprintf("user:%d:profile", 1000000+rng.IntN(9000000))
		case 1:
			keys[i] = fmt.Sprintf("session:%016x", rng.Uint64())
		case 2:
			keys[i] = fmt.Sprintf("product:%d:price:v%d", 100000+rng.IntN(900000), rng.IntN(10))
		default:
			keys[i] = fmt.Sprintf("feed:user:%d:page:%d", 1000000+rng.IntN(9000000), 10+rng.IntN(90))
		}
	}
	return keys
}

// benchAddrs returns n server addresses 10.0.0.1:11211, 10.0.0.2:11211, ...
// SetServers only parses them; nothing is dialled.
func benchAddrs(n int) []string {
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.0.%d.%d:11211", i/250, i%250+1)
	}
	return addrs
}

// benchSelectors returns ours and gomemcache's selector over the same n
// servers, called through the interface as memcache.Client calls them.
func benchSelectors(b *testing.B, n int) []struct {
	name string
	sel  memcache.ServerSelector
} {
	ours, theirs := new(ServerList), new(memcache.ServerList)
	if err := ours.SetServers(benchAddrs(n)...); err != nil {
		b.Fatal(err)
	}
	if err := theirs.SetServers(benchAddrs(n)...); err != nil {
		b.Fatal(err)
	}
	return []struct {
		name string
		sel  memcache.ServerSelector
	}{{"ours", ours}, {"gomemcache", theirs}}
}

var benchSizes = []int{3, 10, 100, 1000, 10000}

func BenchmarkPickServer(b *testing.B) {
	for _, n := range benchSizes {
		for _, s := range benchSelectors(b, n) {
			b.Run(fmt.Sprintf("servers=%d/impl=%s", n, s.name), func(b *testing.B) {
				b.ReportAllocs()
				var a net.Addr
				for i := 0; i < b.N; i++ {
					a, _ = s.sel.PickServer(benchKeys[i&benchKeyMask])
				}
				if a == nil {
					b.Fatal("no server picked")
				}
			})
		}
	}
}

func BenchmarkPickServerParallel(b *testing.B) {
	for _, n := range benchSizes {
		for _, s := range benchSelectors(b, n) {
			b.Run(fmt.Sprintf("servers=%d/impl=%s", n, s.name), func(b *testing.B) {
				b.ReportAllocs()
				var goroutines atomic.Int64
				b.RunParallel(func(pb *testing.PB) {
					start := int(goroutines.Add(1)) * 1031 // each goroutine starts at another key
					i := start
					var a net.Addr
					for pb.Next() {
						a, _ = s.sel.PickServer(benchKeys[i&benchKeyMask])
						i++
					}
					if i > start && a == nil {
						b.Error("no server picked")
					}
				})
			})
		}
	}
}

// BenchmarkRebuild measures a change of servers: newRing alone, from
// scratch; the update of a ring to a set with one server replaced (with,
// built from the ring before); and the whole SetServers (parse,
// canonicalize, build, publish), alternating between two sets that differ
// in one server so that every call updates. It also reports snapshot-B, the
// heap a ServerList holds after SetServers.
func BenchmarkRebuild(b *testing.B) {
	for _, n := range []int{3, 10, 16, 100, 1000, 10000} {
		addrs := benchAddrs(n + 1)
		sets := [2][]string{addrs[:n], addrs[1:]} // one pod replaced
		snapshot := retainedBytes(func() any {
			ss := new(ServerList)
			if err := ss.SetServers(sets[0]...); err != nil {
				b.Fatal(err)
			}
			return ss
		})

		b.Run(fmt.Sprintf("members=%d/op=newRing", n), func(b *testing.B) {
			ms := make([]member, n)
			for i, a := range sets[0] {
				ms[i] = member{id: a, addr: &staticAddr{network: "tcp", str: a}}
			}
			ms = canonical(ms)
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if newRing(ms, DefaultPointsPerServer) == nil {
					b.Fatal("nil ring")
				}
			}
		})
		b.Run(fmt.Sprintf("members=%d/op=update", n), func(b *testing.B) {
			var ms [2][]member
			for i, set := range sets {
				for _, a := range set {
					ms[i] = append(ms[i], member{id: a, addr: &staticAddr{network: "tcp", str: a}})
				}
				ms[i] = canonical(ms[i])
			}
			from := newRing(ms[0], DefaultPointsPerServer)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if from.with(ms[1], DefaultPointsPerServer) == nil {
					b.Fatal("nil ring")
				}
			}
		})
		b.Run(fmt.Sprintf("members=%d/op=SetServers", n), func(b *testing.B) {
			ss := new(ServerList)
			if err := ss.SetServers(sets[1]...); err != nil { // so that the first call updates too
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := ss.SetServers(sets[i%2]...); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(snapshot), "snapshot-B")
		})
	}
}

// retainedBytes returns how much live heap the value that build returns
// holds, measured across two garbage collections.
func retainedBytes(build func() any) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	v := build()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(v)
	if after.HeapAlloc < before.HeapAlloc {
		return 0
	}
	return after.HeapAlloc - before.HeapAlloc
}

// BenchmarkPickServerModes: PickServer under each Hashing beside the
// library's own ring and gomemcache's, over the same servers and keys (not
// part of make bench's report; run it with -bench PickServerModes).
func BenchmarkPickServerModes(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		sels := benchSelectors(b, n)
		for _, m := range []struct {
			name string
			h    Hashing
		}{{"ketama", Ketama()}, {"ch3", Ch3()}} {
			ss := new(ServerList)
			if err := ss.SetHashing(m.h); err != nil {
				b.Fatal(err)
			}
			if err := ss.SetServers(benchAddrs(n)...); err != nil {
				b.Fatal(err)
			}
			sels = append(sels, struct {
				name string
				sel  memcache.ServerSelector
			}{m.name, ss})
		}
		for _, s := range sels {
			b.Run(fmt.Sprintf("servers=%d/impl=%s", n, s.name), func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					s.sel.PickServer(benchKeys[i&benchKeyMask])
				}
			})
		}
	}
}
