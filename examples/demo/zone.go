package main

import (
	"cmp"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	selector "github.com/kubecache/k8s-memcache-selector"
)

// zoneStep is the step in which a whole zone is lost: the memcached of
// every pod of one zone dies at once and returns empty. Two new clients
// over the ServerList play an application in that zone, which keeps
// running (the memcached pods' nodes failed, not the application's): a
// sharded Client, each key on one pod, and a zoned pool, each key on one
// pod of each zone, read in the client's zone first. The pool's reads fail
// over to the other zones while its own is down, and warm it back after.
type zoneStep struct {
	out         *output
	c           config
	control     control
	ss          *selector.ServerList
	ringChanged <-chan struct{}
	opts        []selector.Option // the Client options of step 4's Client
	log         *slog.Logger
	sum         *zoneSummary
}

func (z *zoneStep) run() error {
	out, c, sum := z.out, z.c, z.sum
	pods := len(z.ss.Servers())
	eps, err := readyEndpoints(c, pods)
	if err != nil {
		return err
	}
	byZone := map[string][]endpoint{}
	zoneOf := map[string]string{}
	for _, ep := range eps {
		byZone[ep.zone] = append(byZone[ep.zone], ep)
		zoneOf[ep.addr] = ep.zone
	}
	zones := slices.Sorted(maps.Keys(byZone))
	if len(zones) < 2 || zones[0] == "" {
		return fmt.Errorf("the EndpointSlices put the pods in the zones %q: losing a zone needs two zones, and each endpoint's", zones)
	}
	own, lost := zones[0], zones[0] // the clients' own zone is the one lost
	sum.ClientZone, sum.LostZone, sum.Zones, sum.Servers, sum.ServersLost = own, lost, len(zones), pods, len(byZone[lost])
	out.say("The %d pods run on Nodes of %d zones, and the EndpointSlices give each endpoint its Node's zone:", pods, len(zones))
	for _, zone := range zones {
		var names []string
		for _, ep := range byZone[zone] {
			names = append(names, ep.pod)
		}
		// memcache-7 before memcache-10
		slices.SortFunc(names, func(a, b string) int { return cmp.Or(cmp.Compare(len(a), len(b)), cmp.Compare(a, b)) })
		out.say("  %-8s %s", zone, strings.Join(names, ", "))
	}

	var shardedHits, zonedHits hitCounter // where each client's Gets hit
	sharded, err := selector.NewClientFromList(z.ss, slices.Concat(z.opts, []selector.Option{selector.WithDialContext(shardedHits.dial)})...)
	if err != nil {
		return err
	}
	defer sharded.Close()
	zoned, err := selector.NewClientFromList(z.ss, slices.Concat(z.opts, []selector.Option{
		selector.WithPool(selector.ByZone(own).WithMissFailover()), selector.WithDialContext(zonedHits.dial)})...)
	if err != nil {
		return err
	}
	defer zoned.Close()
	if err := writeKeys(sharded, "sharded:", c.keys); err != nil {
		return err
	}
	if err := writeKeys(zoned, "zoned:", c.keys); err != nil {
		return err
	}
	shardedLoad := startLoad("sharded", sharded, "sharded:", c.keys, z.log)
	defer shardedLoad.stop()
	zonedLoad := startLoad("zoned pool", zoned, "zoned:", c.keys, z.log)
	defer zonedLoad.stop()
	out.say("Two new clients play an application in %s, each with %s keys of its own:", own, count(c.keys))
	out.say("  %-11s selector.NewClientFromList(ss), as in step 4: each key on one pod (keys sharded:...)", "sharded")
	out.say("  %-11s the same with WithPool(selector.ByZone(%q).WithMissFailover()): each key on one", "zoned pool", own)
	out.say("  %-11s pod of each zone, read in %s first, in the other zones on a miss (keys zoned:...)", "", own)
	out.say("Each has written all its keys, and sends %s requests/s: a Get, and a Set after a miss.", count(shardedLoad.rate()))
	out.say("\"in %s\" is the share of the pool's Get hits served there, counted on its connections by server.", own)

	// The pool's column: where its Gets hit, by the servers that answered
	// them. The sharded path's share is kept for the text.
	zh := &zoneHits{zoneOf: zoneOf, zone: own, paths: map[string]*hitCounter{"sharded": &shardedHits, "zoned": &zonedHits}}
	zh.delta()
	var last map[string]hitsIn
	t := out.trafficTable("step", z.ss, shardedLoad, zonedLoad).withColumn("in "+own, 9, func() string {
		last = zh.delta()
		if h := last["zoned"]; h.all > 0 {
			return percent(h.share())
		}
		return "-"
	})
	record := func(ws []*window, phase func(*zoneCounts) *zonePhase) {
		for i, path := range []*zoneCounts{&sum.Sharded, &sum.Pool} {
			ph := phase(path)
			ph.add(ws[i])
			ph.addHits(last[[]string{"sharded", "zoned"}[i]])
		}
	}
	pause := func() (string, error) {
		time.Sleep(c.pause)
		return "", nil
	}
	ws, err := t.row("before the kill", pause)
	if err != nil {
		return err
	}
	record(ws, func(c *zoneCounts) *zonePhase { return &c.Before })

	var answer string
	ws, err = t.row(lost+" killed, still in ring", func() (string, error) {
		a, err := z.control.do("/kill-zone?zone=" + lost)
		if err != nil {
			return "", err
		}
		answer = a
		return "", waitForServers(z.ss, z.ringChanged, pods-sum.ServersLost)
	})
	if err != nil {
		return err
	}
	record(ws, func(c *zoneCounts) *zonePhase { return &c.Killed })
	record(ws, func(c *zoneCounts) *zonePhase { return &c.Down })
	sum.ServersDown = len(z.ss.Servers())
	// Out of the ring until the first of its pods is back: the pods return
	// one by one, and one back already serves its zone's keys.
	ws, err = t.row(lost+" NotReady: out of ring", func() (string, error) {
		down := sum.ServersDown
		return "", waitForRing(z.ss, z.ringChanged, fmt.Sprintf("more than %d", down), func(m int) bool { return m > down })
	})
	if err != nil {
		return err
	}
	record(ws, func(c *zoneCounts) *zonePhase { return &c.Down })
	ws, err = t.row(lost+" back, restarted empty", func() (string, error) {
		if err := waitForServers(z.ss, z.ringChanged, pods); err != nil {
			return "", err
		}
		return pause()
	})
	if err != nil {
		return err
	}
	record(ws, func(c *zoneCounts) *zonePhase { return &c.Back })

	// One pass over the keys, which counts in no row: the sharded Client
	// reads each of its keys, and sets those it misses; the pool's reads
	// each of its keys, reads only: what misses in the returned zone is
	// found in another, and copied back with add.
	var lostAddrs []string
	for _, ep := range byZone[lost] {
		lostAddrs = append(lostAddrs, ep.addr)
	}
	err = t.skip(func() error {
		var err error
		if sum.ShardedPassMisses, err = pass(sharded, "sharded:", c.keys, true); err != nil {
			return err
		}
		if sum.LostZoneKeys.Back, err = heldKeys(lostAddrs, "zoned:", c.keys); err != nil {
			return err
		}
		// Reads only: a Set after a miss would fill the zone on its own.
		if sum.LostZoneKeys.PassMisses, err = pass(zoned, "zoned:", c.keys, false); err != nil {
			return err
		}
		sum.LostZoneKeys.AfterPass, err = heldKeys(lostAddrs, "zoned:", c.keys)
		return err
	})
	if err != nil {
		return err
	}
	ws, err = t.row("after one pass over the keys", pause)
	if err != nil {
		return err
	}
	record(ws, func(c *zoneCounts) *zonePhase { return &c.After })
	sum.ServersAfter = len(z.ss.Servers())

	sh, pl := sum.Sharded, sum.Pool
	out.say("control: %s", answer)
	out.say("%d of the %d pods were in %s, with their share of the sharded keys. The sharded client failed", sum.ServersLost, pods, lost)
	out.say("over at the first refused connection (%s), but each of those keys missed once, until the",
		plural(sh.Down.Errors+sh.Back.Errors, "error", ""))
	out.say("Set after the miss wrote it on another pod: hit rate %s before, %s while %s was down.",
		percent(sh.Before.HitRate), percent(sh.Down.HitRate), lost)
	out.say("The zoned pool has each key in every zone: its reads failed over to the other zones at the first")
	out.say("refused connection, %s from the kill on, hit rate %s while %s was down (%s before),",
		plural(pl.Down.Errors+pl.Back.Errors+pl.After.Errors, "error", ""), percent(pl.Down.HitRate), lost, percent(pl.Before.HitRate))
	out.say("%s of its hits served in %s then (%s before; the sharded client's: %s, spread over the zones).",
		percent(pl.Down.InZone), own, percent(pl.Before.InZone), percent(sh.Before.InZone))
	k := sum.LostZoneKeys
	out.say("The pods of %s came back empty; a moment of the pool's traffic later, they held %s of its", lost, count(k.Back))
	out.say("keys. Before the last row, one pass over the keys: the sharded client read each of its keys and")
	out.say("set the %s it missed; the pool's client read each of its keys (no Sets) and missed %s: what",
		count(sum.ShardedPassMisses), count(k.PassMisses))
	out.say("missed in %s, it found in another zone and copied back with add, and %s then held %s.", own, lost, count(k.AfterPass))
	return nil
}
