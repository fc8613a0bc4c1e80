package histcheck

import (
	"strconv"
	"testing"
	"time"
)

// The events of the table, at times in milliseconds.
func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func set(key, v string, start, end int, ok bool) Event {
	return Event{Kind: Write, Op: "set", Key: key, Value: v, Start: ms(start), End: ms(end), OK: ok}
}

func del(key string, start, end int, ok bool) Event {
	return Event{Kind: Delete, Op: "delete", Key: key, Start: ms(start), End: ms(end), OK: ok}
}

func abandoned(e Event) Event {
	e.Abandoned = true
	return e
}

func get(key, v string, start, end int) Event {
	return Event{Kind: Read, Op: "get", Key: key, Value: v, Found: v != "", Start: ms(start), End: ms(end)}
}

func flushEv(start, end int, ok bool) Event {
	return Event{Kind: Flush, Op: "flush", Start: ms(start), End: ms(end), OK: ok}
}

// A counter's number: offset n in the lineage of write id j.
func num(j, n uint64) string { return strconv.FormatUint(j<<counterBits+n, 10) }

func cset(key string, j uint64, start, end int, ok bool) Event {
	e := set(key, num(j, 0), start, end, ok)
	e.Counter = true
	return e
}

func incr(key, v string, start, end int, ok bool) Event {
	return Event{Kind: Incr, Op: "incr", Key: key, Counter: true, Value: v, Found: v != "", OK: ok, Start: ms(start), End: ms(end)}
}

func cget(key, v string, start, end int) Event {
	e := get(key, v, start, end)
	e.Counter = true
	return e
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name    string
		h       []Event
		stale   int
		rule    string
		unknown int
	}{
		{name: "fresh", h: []Event{set("k", "v1", 0, 1, true), set("k", "v2", 2, 3, true), get("k", "v2", 4, 5)}},
		{name: "stale", h: []Event{set("k", "v1", 0, 1, true), set("k", "v2", 2, 3, true), get("k", "v1", 4, 5)}, stale: 1, rule: "producer"},
		{name: "concurrent writes not stale", // w2 began before w1 ended: either order is legal
			h: []Event{set("k", "v1", 0, 3, true), set("k", "v2", 2, 4, true), get("k", "v1", 5, 6)}},
		{name: "w2 concurrent with read not stale", // w2 not acknowledged before the read began
			h: []Event{set("k", "v1", 0, 1, true), set("k", "v2", 2, 5, true), get("k", "v1", 4, 6)}},
		{name: "read concurrent with w1", h: []Event{set("k", "v1", 0, 1, true), set("k", "v2", 2, 3, true), get("k", "v2", 2, 5)}},
		{name: "failed w2 never proves", h: []Event{set("k", "v1", 0, 1, true), set("k", "v2", 2, 3, false), get("k", "v1", 4, 5)}},
		{name: "failed w1 has no end", // it may land any time after it failed
			h: []Event{set("k", "v1", 0, 1, false), set("k", "v2", 2, 3, true), get("k", "v1", 4, 5)}},
		{name: "delete", h: []Event{set("k", "v1", 0, 1, true), del("k", 2, 3, true), get("k", "v1", 4, 5)}, stale: 1, rule: "producer"},
		{name: "abandoned w1 lands before the next write", // Event.Abandoned: the Client pins its key
			h: []Event{abandoned(set("k", "v1", 0, 1, false)), set("k", "v2", 2, 3, true), get("k", "v1", 4, 5)}, stale: 1, rule: "producer"},
		{name: "abandoned w1 concurrent with w2 not stale",
			h: []Event{abandoned(set("k", "v1", 0, 3, false)), set("k", "v2", 2, 4, true), get("k", "v1", 5, 6)}},
		{name: "abandoned w2 never proves", // it may never have been sent
			h: []Event{set("k", "v1", 0, 1, true), abandoned(set("k", "v2", 2, 3, false)), get("k", "v1", 4, 5)}},
		{name: "failed delete", h: []Event{set("k", "v1", 0, 1, true), del("k", 2, 3, false), get("k", "v1", 4, 5)}},
		{name: "miss always allowed", h: []Event{set("k", "v1", 0, 1, true), get("k", "", 4, 5)}},
		{name: "miss after delete", h: []Event{set("k", "v1", 0, 1, true), del("k", 2, 3, true), get("k", "", 4, 5)}},
		{name: "other key", h: []Event{set("k", "v1", 0, 1, true), set("j", "v2", 2, 3, true), get("k", "v1", 4, 5)}},
		{name: "flush", h: []Event{set("k", "v1", 0, 1, true), flushEv(2, 3, true), get("k", "v1", 4, 5)}, stale: 1, rule: "producer"},
		{name: "failed flush", h: []Event{set("k", "v1", 0, 1, true), flushEv(2, 3, false), get("k", "v1", 4, 5)}},
		{name: "unknown value", h: []Event{set("k", "v1", 0, 1, true), get("k", "v9", 4, 5)}, unknown: 1},
		{name: "getmulti key", h: []Event{set("k", "v1", 0, 1, true), set("k", "v2", 2, 3, true),
			{Kind: Read, Op: "getmulti", Key: "k", Value: "v1", Found: true, Start: ms(4), End: ms(5)}}, stale: 1, rule: "producer"},

		{name: "counter fresh", h: []Event{cset("c", 1, 0, 1, true), incr("c", num(1, 1), 2, 3, true), cget("c", num(1, 1), 4, 5)}},
		{name: "counter stale after increment", // the count passed 1 before the read began
			h:     []Event{cset("c", 1, 0, 1, true), incr("c", num(1, 1), 2, 3, true), incr("c", num(1, 2), 4, 5, true), cget("c", num(1, 1), 6, 7)},
			stale: 1, rule: "producer"},
		{name: "counter concurrent increments", // either may have produced the number read last
			h: []Event{cset("c", 1, 0, 1, true), incr("c", num(1, 1), 2, 5, true), incr("c", num(1, 2), 3, 4, true), cget("c", num(1, 2), 6, 7)}},
		{name: "counter increment read replaced set", // Increment computed from the value a Set replaced
			h: []Event{cset("c", 1, 0, 1, true), cset("c", 2, 2, 3, true), incr("c", num(1, 1), 4, 5, true)}, stale: 1, rule: "producer"},
		{name: "counter lineage", // a number no acknowledged op returned, of a lineage a later Set replaced
			h:     []Event{cset("c", 1, 0, 1, true), incr("c", "", 2, 3, false), cset("c", 2, 4, 5, true), cget("c", num(1, 1), 6, 7)},
			stale: 1, rule: "lineage"},
		{name: "counter lineage of failed set", // its Set may land after the newer one
			h: []Event{cset("c", 1, 0, 1, false), incr("c", "", 2, 3, false), cset("c", 2, 4, 5, true), cget("c", num(1, 1), 6, 7)}},
		{name: "counter failed increment unknown producer", // a failed increment may have produced 2: no proof
			h: []Event{cset("c", 1, 0, 1, true), incr("c", num(1, 1), 2, 3, true), incr("c", "", 4, 5, false), cget("c", num(1, 2), 6, 7)}},
		{name: "counter smaller increment not w2", // after 1 the count may climb to 2 again (a failed increment)
			h: []Event{cset("c", 1, 0, 1, true), incr("c", num(1, 1), 2, 3, true), incr("c", num(1, 2), 4, 5, true),
				incr("c", num(1, 1), 6, 7, true), incr("c", "", 8, 9, false), cget("c", num(1, 2), 10, 11)},
			stale: 1, rule: "producer"}, // but the increment that returned 1 after 2 had been returned is stale
		{name: "counter delete", h: []Event{cset("c", 1, 0, 1, true), del("c", 2, 3, true), cget("c", num(1, 0), 4, 5)}, stale: 1, rule: "producer"},
		{name: "counter increment miss", h: []Event{cset("c", 1, 0, 1, true), del("c", 2, 3, true), incr("c", "", 4, 5, true)}},
		{name: "counter unknown lineage", h: []Event{cset("c", 1, 0, 1, true), cget("c", num(7, 3), 4, 5)}, unknown: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := Check(tc.h)
			if len(res.Stale) != tc.stale || res.Unknown != tc.unknown {
				t.Fatalf("got %d stale, %d unknown, want %d and %d: %+v", len(res.Stale), res.Unknown, tc.stale, tc.unknown, res.Stale)
			}
			if tc.stale > 0 && res.Stale[0].Rule != tc.rule {
				t.Errorf("rule %q, want %q", res.Stale[0].Rule, tc.rule)
			}
			// The order of the events does not matter.
			rev := make([]Event, len(tc.h))
			for i, e := range tc.h {
				rev[len(rev)-1-i] = e
			}
			if got := Check(rev); len(got.Stale) != tc.stale {
				t.Errorf("reversed: %d stale, want %d", len(got.Stale), tc.stale)
			}
		})
	}
}

// The loads' events (see loads.go): a writer's database update with its
// write of the cache, and a read through the cache.
func dbw(op, key, v string, start, end int, ok bool) Event {
	return Event{Kind: Write, Op: op, Key: key, DB: true, Value: v, Start: ms(start), End: ms(end), OK: ok}
}

func gol(key, v string, start, end int) Event {
	e := get(key, v, start, end)
	e.Op, e.DB = "getorload", true
	return e
}

func dbget(key, v string, start, end int) Event {
	e := get(key, v, start, end)
	e.DB = true
	return e
}

func TestCheckLoads(t *testing.T) {
	for _, tc := range []struct {
		name  string
		h     []Event
		stale int
	}{
		{name: "loaded after the write", h: []Event{dbw("db+set", "d", "v1", 0, 1, true), dbw("db+invalidate", "d", "v2", 2, 3, true), gol("d", "v2", 4, 5)}},
		// A GetOrLoad that began after the invalidation returned the value
		// a load in flight from before it read (item 2 of issue 27).
		{name: "joined an older load", h: []Event{dbw("db+set", "d", "v1", 0, 1, true), dbw("db+invalidate", "d", "v2", 2, 3, true), gol("d", "v1", 4, 5)}, stale: 1},
		{name: "began during the write", h: []Event{dbw("db+set", "d", "v1", 0, 1, true), dbw("db+delete", "d", "v2", 2, 4, true), gol("d", "v1", 3, 5)}},
		// A load's set that landed after a newer write (a stale set), read
		// by a Get; the GetOrLoad that loaded it began before the write.
		{name: "stale set", h: []Event{dbw("db+set", "d", "v1", 0, 1, true), gol("d", "v1", 2, 6), dbw("db+delete", "d", "v2", 3, 4, true), dbget("d", "v1", 7, 8)}, stale: 1},
		{name: "failed invalidation proves nothing", h: []Event{dbw("db+set", "d", "v1", 0, 1, true), dbw("db+invalidate", "d", "v2", 2, 3, false), gol("d", "v1", 4, 5)}},
		// A FlushAll empties the cache, not the database: the row loaded
		// after it is the one written before it.
		{name: "flush leaves the rows", h: []Event{dbw("db+set", "d", "v1", 0, 1, true), flushEv(2, 3, true), gol("d", "v1", 4, 5)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if res := Check(tc.h); len(res.Stale) != tc.stale || res.Unknown != 0 {
				t.Errorf("got %d stale, %d unknown, want %d: %+v", len(res.Stale), res.Unknown, tc.stale, res.Stale)
			}
		})
	}
}
