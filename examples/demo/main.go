// Command demo shows k8s-memcache-selector at work on a live cluster. It finds
// the memcached pods of a headless Service, writes keys through them, and
// keeps reading and writing while pods are added, replaced and killed.
//
// While pods are replaced and killed, the same traffic goes through two
// paths over the same ServerList, each with keys of its own:
// memcache.NewFromSelector ("selector only") and a selector.Client, which
// fails over from a dead server and hands moved keys off. The tables show
// each path's errors and hit rate side by side. Then a whole zone is lost,
// and the paths are a sharded selector.Client and one with a zoned pool
// (selector.WithPool(selector.ByZone(zone))), which keeps a copy of each
// key in every zone.
//
// `make demo` runs it on a control plane on this machine (e2e/cmd/demo). It
// is an ordinary client of the library, outside the cluster: it reaches the
// API server with WithAPIServer and the token and CA of the ServiceAccount in
// examples/kubernetes/rbac.yaml. That account may only list and watch
// EndpointSlices, so to change the cluster the program asks the demo's
// control, a small HTTP server that plays the Deployment controller and the
// kubelet:
//
//	POST /scale?replicas=N  start pods until N are ready; answers when done
//	POST /roll-next         replace the oldest pod, as a rolling update does; answers when done
//	POST /kill              SIGKILL memcached in one pod; answers at once, and the pod turns
//	                        NotReady a moment later, as a failing readiness probe would
//	POST /kill-zone?zone=Z  the same for every pod of zone Z at once, as in a zone's outage
//
// Each answers with one line saying what it did.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	selector "github.com/kubecache/k8s-memcache-selector"
)

type config struct {
	service, api, token, ca string // the Service and how to reach the API server
	control                 string // the demo's control URL
	log                     string // the library's log file
	summaryJSON             string
	keys                    int           // keys written and read
	pause                   time.Duration // how long to watch traffic after the killed pod is back
}

func main() {
	var c config
	flag.StringVar(&c.service, "service", "memcache-headless.demo:11211", "the memcached Service, as service.namespace:port")
	flag.StringVar(&c.api, "api", "", "the API server's URL")
	flag.StringVar(&c.token, "token", "", "file with the ServiceAccount token")
	flag.StringVar(&c.ca, "ca", "", "file with the API server's CA certificate")
	flag.StringVar(&c.control, "control", "", "the demo control's URL, which scales, rolls and kills pods")
	flag.StringVar(&c.log, "log", "k8s-memcache-selector-demo.log", "file for the library's logs")
	flag.StringVar(&c.summaryJSON, "summary-json", "", "also write the summary as JSON to this file")
	short := flag.Bool("short", false, "2,000 keys instead of 10,000, and shorter waits (for the e2e test)")
	flag.Parse()
	c.keys, c.pause = 10000, 2*time.Second
	if *short {
		c.keys, c.pause = 2000, time.Second
	}
	if err := run(c); err != nil {
		fmt.Fprintf(os.Stderr, "\ndemo: %v\n", err)
		os.Exit(1)
	}
}

func run(c config) error {
	out := newOutput(os.Stdout)
	control := control{url: c.control}
	sum := summary{Keys: c.keys, LogFile: c.log}

	logFile, err := os.Create(c.log)
	if err != nil {
		return err
	}
	defer logFile.Close()
	logger := slog.New(slog.NewTextHandler(logFile, nil))

	// 1. The library lists the Service's EndpointSlices, then watches them.
	out.chapter("1. Discover the memcached pods of %s", c.service)
	ringChanged := make(chan struct{}, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	ss, err := selector.NewServerList(ctx, c.service,
		selector.WithAPIServer(c.api),
		selector.WithTokenFile(c.token),
		selector.WithCAFile(c.ca),
		selector.WithSlog(logger),
		selector.WithOnChange(func([]net.Addr) {
			select {
			case ringChanged <- struct{}{}:
			default:
			}
		}),
	)
	if err != nil {
		return err
	}
	defer ss.Close()
	pods := len(ss.Servers())
	sum.ServersDiscovered = pods
	out.say("NewServerList found %d servers in %v, and watches for changes:", pods, time.Since(start).Round(time.Millisecond))
	for _, s := range ss.Servers() {
		out.say("  %s", s)
	}
	cache := memcache.NewFromSelector(ss)
	cache.Timeout = 2 * time.Second
	cache.MaxIdleConns = 8

	// 2. Each key goes to the pod that owns it on the ring.
	out.chapter("2. Write %s keys", count(c.keys))
	if err := writeKeys(cache, "ring/", c.keys); err != nil {
		return err
	}
	if err := out.spread(ss, "ring/", c.keys); err != nil {
		return err
	}
	// For comparison: memcache.ServerList, crc32(key) % N over the pods in
	// the order the API lists them, as castai/k8s-memcache-selector (the
	// library this one replaces) used it.
	var modulo memcache.ServerList
	if err := setServersInAPIOrder(&modulo, c, pods); err != nil {
		return err
	}
	moduloCache := memcache.NewFromSelector(&modulo)
	if err := writeKeys(moduloCache, "modulo/", c.keys); err != nil {
		return err
	}
	out.say("The same keys also went through memcache.ServerList (modulo hashing, crc32(key) %% %d over", pods)
	out.say("the pods in API order, as castai/k8s-memcache-selector used it), under the prefix modulo/.")

	// 3. One pod more: the ring moves 1/6 of the keys, modulo nearly all.
	out.chapter("3. Scale from %d to %d pods", pods, pods+1)
	answer, err := control.do(fmt.Sprintf("/scale?replicas=%d", pods+1))
	if err != nil {
		return err
	}
	out.say("control: %s", answer)
	if err := waitForServers(ss, ringChanged, pods+1); err != nil {
		return err
	}
	if err := setServersInAPIOrder(&modulo, c, pods+1); err != nil {
		return err
	}
	pods = len(ss.Servers())
	sum.ServersAfterScale = pods
	ringHits, err := readBack(cache, "ring/", c.keys)
	if err != nil {
		return err
	}
	moduloHits, err := readBack(moduloCache, "modulo/", c.keys)
	if err != nil {
		return err
	}
	sum.RingHitRate = float64(ringHits) / float64(c.keys)
	sum.ModuloHitRate = float64(moduloHits) / float64(c.keys)
	out.say("Both clients now use %d servers. Reading the %s keys back:", pods, count(c.keys))
	cols := []column{{"client", -34}, {"hits", 6}, {"hit rate", 8}}
	out.header(cols)
	out.say("%s", row(cols, "this library (consistent hashing)", count(ringHits), percent(sum.RingHitRate)))
	out.say("%s", row(cols, "memcache.ServerList (modulo)", count(moduloHits), percent(sum.ModuloHitRate)))
	out.say("Ideally %d/%d = %s of the keys stay on their pod: the new pod takes its share (about 1/6), no more.",
		pods-1, pods, percent(float64(pods-1)/float64(pods)))

	// 4. Replace every pod, one by one, while traffic flows: through cache,
	// and through a selector.Client over the same ServerList.
	out.chapter("4. Restart every pod, as a Deployment's rolling update does")
	clientOpts := []selector.Option{
		selector.WithTimeout(cache.Timeout),
		selector.WithMaxIdleConns(cache.MaxIdleConns),
		selector.WithSlog(logger),
	}
	client, err := selector.NewClientFromList(ss, clientOpts...)
	if err != nil {
		return err
	}
	defer client.Close()
	// The modulo client of step 3 is gone, and its keys with it: keys of
	// another hashing on the pods make the Client's mover leave them alone
	// (see selector.Moves), as it would another application's.
	if err := cache.FlushAll(); err != nil {
		return err
	}
	// Both start warm: every key written (scaling up left the ring's cold).
	if err := writeKeys(cache, "ring/", c.keys); err != nil {
		return err
	}
	if err := writeKeys(client, "client/", c.keys); err != nil {
		return err
	}
	// And the long tail: keys set once, and not read until the roll is over.
	if err := writeKeys(cache, "cold-ring/", c.keys); err != nil {
		return err
	}
	if err := writeKeys(client, "cold-client/", c.keys); err != nil {
		return err
	}
	selectorOnly := startLoad("selector only", cache, "ring/", c.keys, logger)
	defer selectorOnly.stop()
	withClient := startLoad("selector.Client", client, "client/", c.keys, logger)
	defer withClient.stop()
	out.say("Traffic all along, through two clients over the same ServerList, each with %s keys of its own:", count(c.keys))
	out.say("  %-16s memcache.NewFromSelector(ss), as above (keys ring/...)", "selector only")
	out.say("  %-16s selector.NewClientFromList(ss), with failover and handoff (keys client/...)", "selector.Client")
	out.say("Each sends %s requests/s, a Get, and a Set after a miss (cache-aside), and starts warm:", count(selectorOnly.rate()))
	out.say("it has just written all its keys.")
	out.say("A step: a new pod starts and turns Ready, then the oldest is deleted: it turns Terminating and")
	out.say("leaves the ring, its memcached serves on through the preStop sleep, stops, and the pod goes.")
	steps := out.trafficTable("step", ss, selectorOnly, withClient)
	ws, err := steps.row("before the roll", func() (string, error) {
		time.Sleep(c.pause)
		return "", nil
	})
	if err != nil {
		return err
	}
	sum.Roll.Selector.Before.add(ws[0])
	sum.Roll.Client.Before.add(ws[1])
	for i := range pods {
		ws, err := steps.row(fmt.Sprintf("%d/%d", i+1, pods), func() (string, error) { return control.do("/roll-next") })
		if err != nil {
			return err
		}
		sum.Roll.Selector.During.add(ws[0])
		sum.Roll.Client.During.add(ws[1])
	}
	sum.Roll.Steps = pods
	sum.Roll.ServersAfter = len(ss.Servers())
	// The keys nobody read: once the Client's moves are done, each path
	// reads its own.
	moves := client.Stats().Moves
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		time.Sleep(time.Second)
		now := client.Stats().Moves
		if now == moves {
			break
		}
		moves = now
	}
	sum.Roll.ColdKeys = c.keys
	if sum.Roll.Selector.ColdFound, err = readBack(cache, "cold-ring/", c.keys); err != nil {
		return err
	}
	if sum.Roll.Client.ColdFound, err = readBack(client, "cold-client/", c.keys); err != nil {
		return err
	}
	if roll := sum.Roll; roll.Selector.During.Errors == 0 && roll.Client.During.Errors == 0 {
		out.say("No request failed: a pod leaves the ring as soon as it turns Terminating, before memcached stops.")
	} else {
		out.say("%s with selector only, %s with selector.Client; the log file has samples.",
			plural(roll.Selector.During.Errors, "request", "failed"), count(roll.Client.During.Errors))
	}
	out.say("Each step moves two shares of the keys, to the new pod and off the old one. With selector only")
	out.say("a moved key misses once, then the Set after the miss writes it back. selector.Client reads a")
	out.say("key that misses at its new pod where it was, and copies it over: from the old pod too, during")
	out.say("its preStop sleep. And it moves every key whose pod changed, read or not: it lists the pods")
	out.say("that lost keys (memcached's lru_crawler metadump) and copies each to its new pod, with its")
	out.say("expiration, the terminating pod's first, at a pace that yields to the application's requests")
	out.say("(%s keys moved in this roll, %s of values).", count(moves.Moved), count(moves.Bytes)+" bytes")
	out.say("Keys set before the roll and not read during it (%s for each path), found after it:", count(c.keys))
	out.say("  %-16s %s (cold-ring/...: the Client moved them too, as they sit on the same pods)", "selector only",
		percent(float64(sum.Roll.Selector.ColdFound)/float64(c.keys)))
	out.say("  %-16s %s (cold-client/...)", "selector.Client", percent(float64(sum.Roll.Client.ColdFound)/float64(c.keys)))

	// 5. A memcached dies without warning; Kubernetes notices a moment later.
	out.chapter("5. Kill one memcached without warning (SIGKILL)")
	after := out.trafficTable("since the kill", ss, selectorOnly, withClient)
	answer, err = control.do("/kill")
	if err != nil {
		return err
	}
	out.say("control: %s", answer)
	untilServers := func(n int) func() (string, error) {
		return func() (string, error) { return "", waitForServers(ss, ringChanged, n) }
	}
	killed, err := after.row("killed, still in the ring", untilServers(pods-1))
	if err != nil {
		return err
	}
	notReady, err := after.row("NotReady: out of the ring", untilServers(pods))
	if err != nil {
		return err
	}
	restarted, err := after.row("restarted: back in the ring", func() (string, error) {
		time.Sleep(c.pause)
		return "", nil
	})
	if err != nil {
		return err
	}
	for i, k := range []*killCounts{&sum.Kill.Selector, &sum.Kill.Client} {
		k.Killed.add(killed[i])
		k.NotReady.add(notReady[i])
		k.Restarted.add(restarted[i])
	}
	sum.Kill.ServersAfter = len(ss.Servers())
	out.say("With selector only, requests for the dead pod's keys failed until Kubernetes marked it")
	out.say("NotReady; then the ring dropped it, and its keys went to the other pods until it came back, empty.")
	if cl := sum.Kill.Client; cl.Killed.Errors+cl.NotReady.Errors+cl.Restarted.Errors == 0 {
		out.say("selector.Client took the pod out at its first refused connection and sent the request on to")
		out.say("the next pod along the ring: no request failed. Once the pod was back, it read the keys that")
		out.say("missed there at the pods that had served them meanwhile.")
	} else {
		out.say("selector.Client took the pod out at its first refused connection and sent its keys to the")
		out.say("next pod along the ring; %s even so (the log file has samples).",
			plural(cl.Killed.Errors+cl.NotReady.Errors+cl.Restarted.Errors, "request", "failed"))
	}

	// 6. A whole zone dies at once. The traffic of steps 4 and 5 stops: the
	// step has clients of its own, and the machine may have 2 cores only.
	selectorOnly.stop()
	withClient.stop()
	out.chapter("6. Lose a zone")
	zs := zoneStep{out: out, c: c, control: control, ss: ss, ringChanged: ringChanged, opts: clientOpts, log: logger, sum: &sum.Zone}
	if err := zs.run(); err != nil {
		return err
	}

	// 7. What it all comes to.
	out.chapter("7. Summary")
	sum.print(out)
	if c.summaryJSON != "" {
		return sum.writeJSON(c.summaryJSON)
	}
	return nil
}

// setServersInAPIOrder sets the servers of a memcache.ServerList to the
// Service's n ready pods, in the order the API lists them.
func setServersInAPIOrder(sl *memcache.ServerList, c config, n int) error {
	servers, err := serversInAPIOrder(c, n)
	if err != nil {
		return err
	}
	return sl.SetServers(servers...)
}
