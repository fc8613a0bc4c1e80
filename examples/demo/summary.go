package main

import (
	"encoding/json"
	"fmt"
	"os"
)

// summary is what the demo found; -summary-json writes it for the e2e test.
type summary struct {
	Keys              int     `json:"keys"`
	ServersDiscovered int     `json:"servers_discovered"`
	ServersAfterScale int     `json:"servers_after_scale"`
	RingHitRate       float64 `json:"ring_hit_rate"`   // keys found after the scale-up, this library
	ModuloHitRate     float64 `json:"modulo_hit_rate"` // the same with memcache.ServerList
	Roll              struct {
		Steps        int `json:"steps"`
		ServersAfter int `json:"servers_after"`
		counts
	} `json:"roll"`
	Kill struct {
		Killed       counts `json:"killed"`    // from the SIGKILL until the pod left the ring
		NotReady     counts `json:"not_ready"` // until it was back
		Restarted    counts `json:"restarted"` // a moment after that
		ServersAfter int    `json:"servers_after"`
	} `json:"kill"`
	LogFile string `json:"log_file"`
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
	k := s.Kill
	lines := [][2]string{
		{"discovery", fmt.Sprintf("%d servers at the start, %d after the scale-up", s.ServersDiscovered, s.ServersAfterScale)},
		{fmt.Sprintf("scale-up %d to %d", s.ServersDiscovered, s.ServersAfterScale),
			fmt.Sprintf("%s of the keys still hit with this library, %s with modulo hashing", percent(s.RingHitRate), percent(s.ModuloHitRate))},
		{"rolling restart", fmt.Sprintf("%d pods replaced under traffic: %s requests, %s errors, hit rate %s",
			s.Roll.Steps, count(s.Roll.Requests), count(s.Roll.Errors), percent(s.Roll.HitRate))},
		{"memcached killed", fmt.Sprintf("%s errors in the %.1fs until its pod turned NotReady, %s after",
			count(k.Killed.Errors), k.Killed.Seconds, count(k.NotReady.Errors+k.Restarted.Errors))},
		{"library log", s.LogFile},
	}
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
