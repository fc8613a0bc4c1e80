package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	selector "github.com/kubecache/k8s-memcache-selector"
)

// key is the i-th key of a path. Its prefix ends with a separator: ring/,
// client/ and so on, sharded: and zoned: in the zone step.
func key(prefix string, i int) string { return prefix + strconv.Itoa(i) }

// writeKeys sets the keys 0 ... n-1 of prefix, from 8 goroutines.
func writeKeys(mc cache, prefix string, n int) error {
	const workers = 8
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n && errs[w] == nil; i += workers {
				errs[w] = mc.Set(&memcache.Item{Key: key(prefix, i), Value: []byte("value")})
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// readBack reads the keys 0 ... n-1 of prefix (GetMulti, 100 at a time) and
// returns how many it found.
func readBack(mc cache, prefix string, n int) (int, error) {
	found := 0
	for i := 0; i < n; i += 100 {
		var keys []string
		for j := i; j < min(i+100, n); j++ {
			keys = append(keys, key(prefix, j))
		}
		items, err := mc.GetMulti(keys)
		if err != nil {
			return 0, err
		}
		found += len(items)
	}
	return found, nil
}

// spread prints how the keys 0 ... n-1 of prefix spread over the
// servers: PickServer is what memcache.Client asks for each key.
func (o *output) spread(ss *selector.ServerList, prefix string, n int) error {
	perServer := map[string]int{}
	for i := range n {
		addr, err := ss.PickServer(key(prefix, i))
		if err != nil {
			return err
		}
		perServer[addr.String()]++
	}
	cols := []column{{"server", -18}, {"keys", 7}, {"share", 6}, {"", -1}}
	o.header(cols)
	for _, s := range ss.Servers() {
		k := perServer[s.String()]
		share := float64(k) / float64(n)
		o.say("%s", row(cols, s, count(k), percent(share), strings.Repeat("█", int(100*share+0.5))))
	}
	return nil
}

// waitForServers waits until the ring has n servers. changed is signalled
// by the ServerList's OnChange hook.
func waitForServers(ss *selector.ServerList, changed <-chan struct{}, n int) error {
	return waitForRing(ss, changed, fmt.Sprint(n), func(m int) bool { return m == n })
}

// waitForRing waits until the ring's size m satisfies ok (want says what
// it waits for, for the error), at most 30 s.
func waitForRing(ss *selector.ServerList, changed <-chan struct{}, want string, ok func(m int) bool) error {
	timeout := time.After(30 * time.Second)
	for !ok(len(ss.Servers())) {
		select {
		case <-changed:
		case <-timeout:
			return fmt.Errorf("the ring has %d servers after 30s, not %s: %v", len(ss.Servers()), want, ss.Servers())
		}
	}
	return nil
}
