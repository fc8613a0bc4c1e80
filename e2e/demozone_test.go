package e2e

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The demo's zone step (examples/demo/zone.go): the memcached of both pods
// of the clients' own zone (of 3) SIGKILLed, the pods NotReady, then
// restarted empty, under the traffic of a sharded selector.Client and of a
// zoned pool (ByZone(client's zone).WithMissFailover()), each with keys of
// its own.

// demoZone is the zone step's part of the demo's summary.
type demoZone struct {
	ClientZone   string         `json:"client_zone"`
	LostZone     string         `json:"lost_zone"`
	Zones        int            `json:"zones"`
	Servers      int            `json:"servers"`
	ServersLost  int            `json:"servers_lost"`
	ServersDown  int            `json:"servers_down"`
	ServersAfter int            `json:"servers_after"`
	Sharded      demoZoneCounts `json:"sharded"`
	Pool         demoZoneCounts `json:"pool"`
	LostZoneKeys struct {
		Back       int `json:"back"`
		AfterPass  int `json:"after_pass"`
		PassMisses int `json:"pass_misses"`
	} `json:"lost_zone_keys"`
}

type demoZoneCounts struct {
	Before demoZonePhase `json:"before"`
	Killed demoZonePhase `json:"killed"`
	Down   demoZonePhase `json:"down"`
	Back   demoZonePhase `json:"back"`
	After  demoZonePhase `json:"after"`
}

type demoZonePhase struct {
	demoCounts
	HitsAll int64   `json:"hits_all"`
	InZone  float64 `json:"in_zone"`
}

// checkDemoZone checks the zone step's figures. Short mode runs each phase
// for 1-3 s at 2,000 requests/s per path at most; on a loaded machine
// fewer, which only deepens the sharded path's loss (fewer of its lost
// keys are read, and written back, in a phase), so the bounds hold.
func checkDemoZone(t *testing.T, s demoSummary) {
	t.Helper()
	z := s.Zone
	if z.Zones != 3 || z.ClientZone == "" || z.LostZone != z.ClientZone {
		t.Errorf("zone: %d zones, the clients in %q, %q lost; want 3 zones, and the clients' own lost", z.Zones, z.ClientZone, z.LostZone)
	}
	if z.Servers != 6 || z.ServersLost != 2 || z.ServersDown != 4 || z.ServersAfter != 6 {
		t.Errorf("zone: %d servers, %d in the lost zone, %d in the ring while it was NotReady, %d after; want 6, 2, 4, 6",
			z.Servers, z.ServersLost, z.ServersDown, z.ServersAfter)
	}
	for _, p := range []struct {
		name string
		c    demoZoneCounts
	}{{"sharded", z.Sharded}, {"zoned pool", z.Pool}} {
		for _, ph := range []struct {
			name string
			c    demoZonePhase
		}{{"before", p.c.Before}, {"until the zone left the ring", p.c.Killed}, {"while it was down", p.c.Down}, {"when it was back", p.c.Back}, {"after", p.c.After}} {
			if ph.c.Requests < 200 {
				t.Errorf("zone, %s: %d requests %s, want traffic (200 or more)", p.name, ph.c.Requests, ph.name)
			}
		}
		if p.c.Before.HitRate < 0.95 {
			t.Errorf("zone, %s: hit rate %.3f before the kill, want a warm cache (0.95 or more)", p.name, p.c.Before.HitRate)
		}
		// One pass over the keys by each client leaves every key where
		// it reads it.
		if p.c.After.HitRate < p.c.Before.HitRate-0.02 {
			t.Errorf("zone, %s: hit rate %.3f before the kill, %.3f after the zone returned and one pass; want it back (2 points at most below)",
				p.name, p.c.Before.HitRate, p.c.After.HitRate)
		}
	}

	// The sharded path had a third of its keys in the lost zone: each
	// missed once while the zone was down, until the Set after the miss
	// wrote it elsewhere. Of R requests, R/3 were for the K = keys/3 lost
	// keys, and K(1-e^(-R/3K)) of those missed; at least a quarter of
	// min(K, R/3) must have, whatever the traffic and however long the
	// zone took to leave the ring (a drop of the hit rate would not do:
	// it shrinks as the phase grows). Before the kill, none missed. This
	// shows the zone was lost.
	sh, pl := z.Sharded, z.Pool
	missed := sh.Down.Requests - sh.Down.Hits
	if lost := int64(s.Keys / 3); missed*4 < min(lost, sh.Down.Requests/3) {
		t.Errorf("zone, sharded: %d of %d requests missed while the zone was down (hit rate %.3f, %.3f before); want %d or more (was the zone killed?)",
			missed, sh.Down.Requests, sh.Down.HitRate, sh.Before.HitRate, min(lost, sh.Down.Requests/3)/4)
	}
	// The pool has every key in every zone: its reads fail over to the
	// others while its own is down.
	if n := pl.Down.Errors + pl.Back.Errors + pl.After.Errors; n != 0 {
		t.Errorf("zone, zoned pool: %d errors from the kill on (%d while the zone was down, %d when it was back, %d after), want 0",
			n, pl.Down.Errors, pl.Back.Errors, pl.After.Errors)
	}
	if drop := pl.Before.HitRate - pl.Down.HitRate; drop > 0.02 {
		t.Errorf("zone, zoned pool: hit rate %.3f before the kill, %.3f while the zone was down; want a drop of 2 points at most",
			pl.Before.HitRate, pl.Down.HitRate)
	}
	// Where the Gets hit, from memcached's counters: the pool's in the
	// client's zone before the kill and after the pass, in the others
	// while it was down (the counters of the killed memcached are gone,
	// so its hits there count as none); the sharded path's spread over
	// the zones (2 of 6 pods in each), which shows the counts tell the
	// zones apart.
	if pl.Before.InZone < 0.95 || pl.After.InZone < 0.95 || pl.Down.HitsAll == 0 || pl.Down.InZone > 0.05 {
		t.Errorf("zone, zoned pool: %.3f of the Get hits served in %s before the kill, %.3f of %d while it was down, %.3f after; want 0.95 or more, then 0.05 or less (served by the other zones), then 0.95 or more",
			pl.Before.InZone, z.ClientZone, pl.Down.InZone, pl.Down.HitsAll, pl.After.InZone)
	}
	if sh.Before.HitsAll == 0 || sh.Before.InZone > 0.6 {
		t.Errorf("zone, sharded: %.3f of %d Get hits served in %s before the kill; want hits, about a third of them there",
			sh.Before.InZone, sh.Before.HitsAll, z.ClientZone)
	}
	// The lost zone came back empty, and the pool's reads warmed it: its
	// misses there failed over to the other zones, and what they found
	// was copied back. Its traffic ran meanwhile, so by the time of the
	// count some keys are back already; a pass of reads brings the rest.
	if k := z.LostZoneKeys; k.AfterPass < s.Keys*95/100 || k.PassMisses*100 > s.Keys || k.AfterPass <= k.Back {
		t.Errorf("zone: the lost zone's memcached held %d of the pool's %d keys when it came back, %d after a pass of the pool's reads, which missed %d; want more after, 95%% or more, and under 1%% missed",
			k.Back, s.Keys, k.AfterPass, k.PassMisses)
	}
}

// checkDemoZoneOutput checks that the demo printed the zone step's rows,
// with the numbers of its summary, and the summary's line on the pool.
func checkDemoZoneOutput(t *testing.T, out string, s demoSummary) {
	t.Helper()
	z := s.Zone
	if n := len(regexp.MustCompile(`(?m)^ +sharded +zoned pool$`).FindAllString(out, -1)); n != 1 {
		t.Errorf("the demo's output names the zone step's paths (sharded, zoned pool) over %d tables, want 1", n)
	}
	// A row: label, time, servers, errors and hit rate for each path, and
	// the pool's share of hits in its zone.
	rowOf := func(label string) []string {
		re := regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(label) +
			`\s+([\d.]+)s\s+\d+\s+([\d,]+)\s+([\d.]+%)\s+([\d,]+)\s+([\d.]+%)\s+([\d.]+%|-)$`)
		m := re.FindStringSubmatch(out)
		if m == nil {
			t.Errorf("the demo's output has no row %q with errors and hit rate for both paths and the pool's hits in zone", label)
		}
		return m
	}
	num := func(s string) int64 {
		n, _ := strconv.ParseInt(strings.ReplaceAll(s, ",", ""), 10, 64)
		return n
	}
	if m := rowOf("before the kill"); m != nil {
		got := []string{m[3], m[5], m[6]}
		want := []string{pct(z.Sharded.Before.HitRate), pct(z.Pool.Before.HitRate), pct(z.Pool.Before.InZone)}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("row %q: hit rates and share in zone %v, the summary's %v", "before the kill", got, want)
		}
	}
	var downErrs int64
	for _, label := range []string{z.LostZone + " killed, still in ring", z.LostZone + " NotReady: out of ring"} {
		if m := rowOf(label); m != nil {
			downErrs += num(m[4])
			if label == z.LostZone+" killed, still in ring" && m[3] != pct(z.Sharded.Killed.HitRate) {
				t.Errorf("row %q: the sharded hit rate %s, the summary's %s", label, m[3], pct(z.Sharded.Killed.HitRate))
			}
		}
	}
	if downErrs != z.Pool.Down.Errors {
		t.Errorf("the zone step's rows show %d errors of the pool while the zone was down, the summary %d", downErrs, z.Pool.Down.Errors)
	}
	rowOf(z.LostZone + " back, restarted empty")
	if m := rowOf("after one pass over the keys"); m != nil && m[5] != pct(z.Pool.After.HitRate) {
		t.Errorf("row %q: the pool's hit rate %s, the summary's %s", "after one pass over the keys", m[5], pct(z.Pool.After.HitRate))
	}
	if want := "  zoned pool         0 errors, hit rate " + pct(z.Pool.Before.HitRate) + " before, " + pct(z.Pool.Down.HitRate) +
		" while " + z.LostZone + " was down"; !strings.Contains(out, want) {
		t.Errorf("the demo's summary has no line %q...", want)
	}
}
