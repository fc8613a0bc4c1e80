package proxybench

import (
	"context"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	selector "github.com/kubecache/k8s-memcache-selector"
	"github.com/kubecache/k8s-memcache-selector/internal/meta"
)

// BenchmarkGetMultiFloor is a GetMulti of multiKeys keys over the Tier's 3
// servers, 1 goroutine, through the Client and through its floor, against
// gomemcache at its best (MaxIdleConns vsParallel), alternating: each
// iteration calls the three in turn, in orders that rotate, so that the
// machine's state is the same for all. Its metrics are the ratios of the
// mean and the p50 latency of each to gomemcache's in the same run.
//
// The floor is the Client's GetMulti without the Client: each server's
// keys (split by gomemcache's ServerList before the timing: no routing, no
// gate, no result map) go as one meta batch on one pipelined connection
// per server, all sent first and then read one after the other on the
// benchmark's goroutine. What the Client takes beyond the floor is its
// own; what the floor takes beyond gomemcache is the meta protocol's and
// the servers': a batch of n keys is n+1 commands, where gomemcache's is
// one get of n keys, and memcached serves at most its -R (reqs_per_event,
// 20 by default) commands of a connection per event before it yields.
func BenchmarkGetMultiFloor(b *testing.B) {
	t, err := sharedTier()
	if err != nil {
		b.Skip(err)
	}
	mc := memcache.New(t.Servers...)
	mc.Timeout, mc.MaxIdleConns = 5*time.Second, vsParallel
	defer mc.Close()
	if err := load(mc, gomemcache); err != nil {
		b.Fatal(err)
	}
	var sl memcache.ServerList
	if err := sl.SetServers(t.Servers...); err != nil {
		b.Fatal(err)
	}
	index := map[string]int{}
	pools := make([]*meta.Pool, len(t.Servers))
	for i, s := range t.Servers {
		a, err := net.ResolveTCPAddr("tcp", s)
		if err != nil {
			b.Fatal(err)
		}
		index[a.String()] = i
		var d net.Dialer
		pools[i] = meta.NewPool(func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "tcp", s) },
			meta.Options{Timeout: 5 * time.Second, MaxConns: 1})
		defer pools[i].Close()
	}
	// split[j][i] is batch j's keys of server i.
	split := make([][][]string, len(benchBatches))
	for j, keys := range benchBatches {
		split[j] = make([][]string, len(t.Servers))
		for _, k := range keys {
			a, err := sl.PickServer(k)
			if err != nil {
				b.Fatal(err)
			}
			i := index[a.String()]
			split[j][i] = append(split[j][i], k)
		}
	}
	opt := meta.GetOptions{Value: true, ClientFlags: true, CAS: true}
	floor := func(i int) error {
		ctx := context.Background()
		var bts [3]meta.Batch
		for s, ks := range split[i%len(split)] {
			bt, err := pools[s].StartGetMulti(ctx, ks, opt)
			if err != nil {
				return err
			}
			bts[s] = bt
		}
		hits := 0
		for s := range split[i%len(split)] {
			if err := bts[s].Wait(ctx); err != nil {
				return err
			}
			hits += bts[s].Hits()
		}
		if hits != multiKeys {
			return fmt.Errorf("%d hits of %d", hits, multiKeys)
		}
		return nil
	}
	gm := func(i int) error {
		m, err := mc.GetMulti(benchBatches[i%len(benchBatches)])
		if err == nil && len(m) != multiKeys {
			err = fmt.Errorf("%d hits of %d", len(m), multiKeys)
		}
		return err
	}
	ss := new(selector.ServerList)
	if err := ss.SetServers(t.Servers...); err != nil {
		b.Fatal(err)
	}
	sc, err := selector.NewClientFromList(ss, selector.WithTimeout(5*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	defer sc.Close()
	if err := load(sc, withClient); err != nil {
		b.Fatal(err)
	}
	cl := func(i int) error {
		keys := benchBatches[i%len(benchBatches)]
		m, err := sc.GetMulti(keys)
		if err == nil && len(m) != multiKeys {
			err = fmt.Errorf("%d hits of %d", len(m), multiKeys)
		}
		return err
	}
	floorLoop(b, gm, cl, floor)
}

// BenchmarkGetFloor is BenchmarkGetMultiFloor for a Get hit, 1 goroutine:
// gomemcache at its best, the Client, and the floor (a meta mg on one
// pipelined connection to the key's server, picked by gomemcache's
// ServerList before the timing; written and read on the benchmark's
// goroutine, as a request alone on a Conn is), alternating.
func BenchmarkGetFloor(b *testing.B) {
	t, err := sharedTier()
	if err != nil {
		b.Skip(err)
	}
	mc := memcache.New(t.Servers...)
	mc.Timeout, mc.MaxIdleConns = 5*time.Second, vsParallel
	defer mc.Close()
	if err := load(mc, gomemcache); err != nil {
		b.Fatal(err)
	}
	var sl memcache.ServerList
	if err := sl.SetServers(t.Servers...); err != nil {
		b.Fatal(err)
	}
	pools := map[string]*meta.Pool{}
	for _, s := range t.Servers {
		a, err := net.ResolveTCPAddr("tcp", s)
		if err != nil {
			b.Fatal(err)
		}
		var d net.Dialer
		pools[a.String()] = meta.NewPool(func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "tcp", s) },
			meta.Options{Timeout: 5 * time.Second, MaxConns: 1})
		defer pools[a.String()].Close()
	}
	keyPool := make([]*meta.Pool, len(benchKeys))
	for i, k := range benchKeys {
		a, err := sl.PickServer(k)
		if err != nil {
			b.Fatal(err)
		}
		keyPool[i] = pools[a.String()]
	}
	ss := new(selector.ServerList)
	if err := ss.SetServers(t.Servers...); err != nil {
		b.Fatal(err)
	}
	sc, err := selector.NewClientFromList(ss, selector.WithTimeout(5*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	defer sc.Close()
	if err := load(sc, withClient); err != nil {
		b.Fatal(err)
	}
	opt := meta.GetOptions{Value: true, ClientFlags: true, CAS: true}
	ctx := context.Background()
	floorLoop(b,
		func(i int) error { _, err := mc.Get(benchKeys[i&benchKeyMask]); return err },
		func(i int) error { _, err := sc.Get(benchKeys[i&benchKeyMask]); return err },
		func(i int) error {
			_, err := keyPool[i&benchKeyMask].Get(ctx, benchKeys[i&benchKeyMask], opt)
			return err
		})
}

// floorLoop is the floor benchmarks' loop: after 20 untimed calls of each
// (connections dialled), it calls gm, client and floor with i from 0 to
// b.N-1, the three in turn in clientOrders' rotating orders, so that the
// machine's state is the same for all, and timing each call. It reports
// client's and floor's mean and p50 latency as ratios to gm's, and gm's p50.
func floorLoop(b *testing.B, gm, client, floor func(i int) error) {
	impls := []func(int) error{gm, client, floor}
	for i := range 20 {
		for _, f := range impls {
			if err := f(i); err != nil {
				b.Fatal(err)
			}
		}
	}
	orders := clientOrders(len(impls))
	lat := make([][]time.Duration, len(impls))
	for j := range lat {
		lat[j] = make([]time.Duration, 0, b.N)
	}
	b.ResetTimer()
	for i := range b.N {
		for _, j := range orders[i%len(orders)] {
			start := time.Now()
			if err := impls[j](i); err != nil {
				b.Fatal(err)
			}
			lat[j] = append(lat[j], time.Since(start))
		}
	}
	b.StopTimer()
	means := make([]time.Duration, len(impls))
	for j := range lat {
		means[j] = mean(lat[j])
		slices.Sort(lat[j])
	}
	for j, name := range []string{"client", "floor"} {
		b.ReportMetric(float64(means[j+1])/float64(means[0]), name+"/gm-mean")
		b.ReportMetric(float64(quantile(lat[j+1], 0.5))/float64(quantile(lat[0], 0.5)), name+"/gm-p50")
	}
	b.ReportMetric(float64(quantile(lat[0], 0.5)), "gm-p50-ns")
}
