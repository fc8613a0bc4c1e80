package main

import (
	"encoding/json"
	"fmt"
	"os"
)

// summary is what the demo found; -summary-json writes it for the e2e test.
// Under traffic (the rolling restart and the kill) it counts each path on
// its own: "selector", memcache.NewFromSelector over the ServerList, and
// "client", a selector.Client over the same ServerList; the zone step has
// paths of its own (zoneSummary).
type summary struct {
	Keys              int     `json:"keys"`
	ServersDiscovered int     `json:"servers_discovered"`
	ServersAfterScale int     `json:"servers_after_scale"`
	RingHitRate       float64 `json:"ring_hit_rate"`   // keys found after the scale-up, this library
	ModuloHitRate     float64 `json:"modulo_hit_rate"` // the same with memcache.ServerList
	Roll              struct {
		Steps        int        `json:"steps"`
		ServersAfter int        `json:"servers_after"`
		ColdKeys     int        `json:"cold_keys"` // each path's`
		Selector     rollCounts `json:"selector"`
		Client       rollCounts `json:"client"`
	} `json:"roll"`
	Kill struct {
		ServersAfter int        `json:"servers_after"`
		Selector     killCounts `json:"selector"`
		Client       killCounts `json:"client"`
	} `json:"kill"`
	Zone    zoneSummary `json:"zone"`
	LogFile string      `json:"log_file"`
}

// zoneSummary is the zone step: the clients' own zone lost, through a
// sharded Client ("sharded") and a zoned pool ("pool"), each with keys of
// its own.
type zoneSummary struct {
	ClientZone   string     `json:"client_zone"`
	LostZone     string     `json:"lost_zone"`
	Zones        int        `json:"zones"`
	Servers      int        `json:"servers"`      // in the ring before the kill
	ServersLost  int        `json:"servers_lost"` // the lost zone's
	ServersDown  int        `json:"servers_down"` // in the ring while they were NotReady
	ServersAfter int        `json:"servers_after"`
	Sharded      zoneCounts `json:"sharded"`
	Pool         zoneCounts `json:"pool"`
	// The pass over the keys between the last two rows: the keys the
	// sharded Client did not find (and set); and the pool's keys that the
	// lost zone's memcached held before and after the pool's client read
	// each once (reads only), and those it did not find.
	ShardedPassMisses int `json:"sharded_pass_misses"`
	LostZoneKeys      struct {
		Back       int `json:"back"`
		AfterPass  int `json:"after_pass"`
		PassMisses int `json:"pass_misses"`
	} `json:"lost_zone_keys"`
}

// zoneCounts are one path's requests in the zone step.
type zoneCounts struct {
	Before zonePhase `json:"before"` // a moment of traffic before the kill
	Killed zonePhase `json:"killed"` // from the SIGKILL until the zone's pods left the ring
	Down   zonePhase `json:"down"`   // from the SIGKILL until they were back in it
	Back   zonePhase `json:"back"`   // a moment after that, its memcached restarted empty
	After  zonePhase `json:"after"`  // a moment after one pass over the keys
}

// zonePhase counts the requests of a phase, and, from memcached's own
// counters, the Get hits for the path's keys served in the clients' zone
// and in all.
type zonePhase struct {
	counts
	HitsInZone int64   `json:"hits_in_zone"`
	HitsAll    int64   `json:"hits_all"`
	InZone     float64 `json:"in_zone"` // HitsInZone / HitsAll
}

func (p *zonePhase) addHits(h hitsIn) {
	p.HitsInZone += h.zone
	p.HitsAll += h.all
	if p.HitsAll > 0 {
		p.InZone = float64(p.HitsInZone) / float64(p.HitsAll)
	}
}

// rollCounts are one path's requests in the rolling restart.
type rollCounts struct {
	Before    counts `json:"before"`     // a moment of traffic before the first step
	During    counts `json:"during"`     // all the steps
	ColdFound int    `json:"cold_found"` // of the cold keys (set before the roll, not read during it), found after it
}

// killCounts are one path's requests after the kill.
type killCounts struct {
	Killed    counts `json:"killed"`    // from the SIGKILL until the pod left the ring
	NotReady  counts `json:"not_ready"` // until it was back
	Restarted counts `json:"restarted"` // a moment after that
}

// counts of requests under traffic, in one window or several.
type counts struct {
	Seconds       float64 `json:"seconds"`
	Requests      int64   `json:"requests"`
	Hits          int64   `json:"hits"`
	Errors        int64   `json:"errors"`
	RoutingErrors int64   `json:"routing_errors"` // refused, reset or closed connections
	HitRate       float64 `json:"hit_rate"`
}

func (c *counts) add(w *window) {
	c.Seconds += w.took.Seconds()
	c.Requests += w.reqs.Load()
	c.Hits += w.hits.Load()
	c.Errors += w.errs.Load()
	c.RoutingErrors += w.routingErrs.Load()
	if c.Requests > 0 {
		c.HitRate = float64(c.Hits) / float64(c.Requests)
	}
}

func (s *summary) print(o *output) {
	r, k := s.Roll, s.Kill
	killErrors := func(c killCounts) int64 { return c.Killed.Errors + c.NotReady.Errors + c.Restarted.Errors }
	client := fmt.Sprintf("%s after the kill (not %s), hit rate %s during the roll (not %s)",
		plural(killErrors(k.Client), "error", ""), count(killErrors(k.Selector)), percent(r.Client.During.HitRate), percent(r.Selector.During.HitRate))
	if r.Client.During.Errors > 0 {
		client += fmt.Sprintf("; %s in the roll", plural(r.Client.During.Errors, "error", ""))
	}
	lines := [][2]string{
		{"discovery", fmt.Sprintf("%d servers at the start, %d after the scale-up", s.ServersDiscovered, s.ServersAfterScale)},
		{fmt.Sprintf("scale-up %d to %d", s.ServersDiscovered, s.ServersAfterScale),
			fmt.Sprintf("%s of the keys still hit with this library, %s with modulo hashing", percent(s.RingHitRate), percent(s.ModuloHitRate))},
		{"rolling restart", fmt.Sprintf("%d pods replaced; selector only: %s errors, hit rate %s before, %s during",
			r.Steps, count(r.Selector.During.Errors), percent(r.Selector.Before.HitRate), percent(r.Selector.During.HitRate))},
		{"memcached killed", fmt.Sprintf("selector only: %s errors in the %.1fs until its pod turned NotReady, %s after",
			count(k.Selector.Killed.Errors), k.Selector.Killed.Seconds, count(k.Selector.NotReady.Errors+k.Selector.Restarted.Errors))},
		{"selector.Client", client},
	}
	if z := s.Zone; z.LostZone != "" {
		lines = append(lines,
			[2]string{z.LostZone + " lost", fmt.Sprintf("%d of %d pods; sharded: %s, hit rate %s before, %s while it was down",
				z.ServersLost, z.Servers, plural(z.Sharded.Down.Errors, "error", ""), percent(z.Sharded.Before.HitRate), percent(z.Sharded.Down.HitRate))},
			[2]string{"zoned pool", fmt.Sprintf("%s, hit rate %s before, %s while %s was down (%s of it served in %s)",
				plural(z.Pool.Down.Errors, "error", ""), percent(z.Pool.Before.HitRate), percent(z.Pool.Down.HitRate), z.LostZone,
				percent(z.Pool.Down.InZone), z.ClientZone)})
	}
	lines = append(lines, [2]string{"library log", s.LogFile})
	for _, l := range lines {
		o.say("%-18s %s", l[0], l[1])
	}
}

func (s *summary) writeJSON(path string) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
