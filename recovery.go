package selector

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// recover brings back s, which answered a probe, and reports whether it is
// up. What s holds from before its outage may be older than what this
// client wrote elsewhere meanwhile:
//
//   - If memcached says that its process started after the outage began,
//     it holds nothing from before: only the stand-ins' copies are cleaned.
//   - Else, if its log overflowed, a CAS floor is taken (see casNow): no
//     value of s older than now is served; they are deleted as they are
//     read.
//   - Else its logged keys stay in the log, which the read gate checks,
//     and are deleted in the background (see drain).
//
// s is up as soon as that is decided: a long log cannot keep it out, nor
// writes to its keys during the drain (the gate cleans a logged key before
// any request uses it).
func (c *Client) recover(s *server) bool {
	c.mu.Lock()
	if s.status() != down {
		c.mu.Unlock()
		return s.status() == up
	}
	downAt := s.downAt.Unix()
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(c.ctx, 4*c.cfg.conn.timeout)
	defer cancel()
	// It answered the probe: stats is tried three times, each within the
	// timeout (a machine starved of CPU fails one now and then).
	start, err := serverStart(ctx, s, c.cfg.conn)
	for try := 1; err != nil && try < 3 && ctx.Err() == nil; try++ {
		start, err = serverStart(ctx, s, c.cfg.conn)
	}
	if err != nil {
		c.log.Warn("server answered a probe, but not stats: it stays out", keyServer, s.addr.str, keyError, err)
		return false
	}
	// memcached's process start (its clock's time less its uptime) is a
	// constant of the process, a few seconds before it really started; so a
	// start after the outage began, by more than the clocks of two machines
	// differ, proves a restart. A restart it cannot prove costs a replay of
	// deletes that find nothing.
	restarted := start > downAt+restartSlack
	var standIns map[string][]*server
	if restarted {
		standIns = c.inval.take(s)
		s.floor.Store(0) // its CAS ids start again from 1
	} else if _, overflowed := c.inval.state(s); overflowed {
		floor, err := c.casNow(ctx, s)
		if err != nil {
			c.log.Warn("server answered a probe, but not a write: it stays out", keyServer, s.addr.str, keyError, err)
			return false
		}
		s.floor.Store(floor)
		s.started.Store(start)
		c.inval.clearOverflow(s)
	}

	if restarted {
		s.losses.takeOwed() // its values went with its process
		s.losses.takeMarks()
	} else {
		// The slots it lost while out for this Client are recorded
		// before this Client uses it again (see serverLosses); one that
		// takes no record is used all the same, with a warning.
		c.writeOwed(ctx, s)
	}

	// Up, and routed to, in one step for Stats (which waits for a
	// refresh under way): a server reported back is one requests go to.
	c.refreshing.Lock()
	c.mu.Lock()
	if s.status() != down {
		c.mu.Unlock()
		c.refreshing.Unlock()
		return s.status() == up
	}
	if s.soft {
		c.outs.give(s)
	}
	s.state.Store(int32(up))
	c.mu.Unlock()
	n, overflowed := c.inval.state(s)
	if overflowed { // a FlushAll or an overflow while it was being decided
		c.floorNow(s)
	}
	c.refreshLocked(time.Now())
	c.refreshing.Unlock()
	c.log.Info("server back for this client", keyServer, s.addr.str, "restarted", restarted, "invalidations", n)
	c.reportBack(s, restarted)
	c.signal() // and the run loop's timer follows the new past ring
	c.drain(s, standIns)
	return true
}

// drain deletes, in the background, s's logged keys at s and at the
// stand-ins that took them, and the keys of standIns (those of a server that
// restarted) at their stand-ins only. It stops when s is out again (the
// keys left stay logged) or the Client closes.
func (c *Client) drain(s *server, standIns map[string][]*server) {
	c.mu.Lock()
	if s.draining || c.closed.Load() {
		c.mu.Unlock()
		return
	}
	s.draining = true
	c.mu.Unlock()
	c.wg.Go(func() {
		defer func() {
			c.mu.Lock()
			s.draining = false
			c.mu.Unlock()
		}()
		for k, ts := range standIns {
			for _, t := range ts {
				if c.ctx.Err() != nil {
					return
				}
				c.cleanStandIn(c.ctx, s, k, t)
			}
		}
		for c.ctx.Err() == nil && s.status() == up && s.pending.Load() {
			keys := c.inval.keys(s)
			if len(keys) == 0 {
				return // overflowed only: a floor stands for it once s is next back
			}
			// s fails, or the keys are logged again (their stand-ins are
			// still routed to, see cleanStandIn): try again after a
			// probe's delay.
			if c.drainKeys(s, keys) == 0 || c.inval.holds(s, keys) {
				select {
				case <-c.ctx.Done():
				case <-time.After(c.cfg.probeMin):
				}
			}
		}
	})
}

// drainKeys cleans keys at s (see replay), and returns how many it did.
func (c *Client) drainKeys(s *server, keys map[string][]*server) int {
	n := c.replay(c.ctx, s, keys, func(err error) { c.observe(s, failureOf(err), err) })
	c.reportReplay(s, n)
	return n
}

// replayWorkers is how many keys a drain cleans at once.
const replayWorkers = 8

// casNow returns a CAS id that s hands out now: every value s holds that
// was written before has a lower one.
func (c *Client) casNow(ctx context.Context, s *server) (uint64, error) {
	var it *memcache.Item
	err := s.call(func(w wire) (err error) {
		if err = w.Store(ctx, opSet, &memcache.Item{Key: probeKey, Value: []byte{'1'}, Expiration: 60}); err == nil {
			it, err = w.Get(ctx, probeKey)
		}
		return err
	})
	if err != nil {
		return 0, err
	}
	return it.CasID, nil
}

// restartSlack is how far, in seconds, a server's clock may be ahead of
// the Client's for a restart judged from it to be sound.
const restartSlack = 2

// serverStart asks s, with memcached's stats command, when its process
// started (unix seconds, by its own clock): its time less its uptime. Both
// come from memcached's clock, which ticks once a second and lags after the
// process was stopped (SIGSTOP); their difference does not move.
func serverStart(ctx context.Context, s *server, cc connConfig) (start int64, err error) {
	st, err := serverStats(ctx, s, cc, "stats")
	if err != nil {
		return 0, err
	}
	now, err1 := strconv.ParseInt(st["time"], 10, 64)
	uptime, err2 := strconv.ParseInt(st["uptime"], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("stats without time and uptime")
	}
	return now - uptime, nil
}

// serverStats sends s cmd, one of memcached's stats commands, on a
// connection of its own (either protocol's servers answer it), and returns
// the stats it answered, by name.
func serverStats(ctx context.Context, s *server, cc connConfig, cmd string) (map[string]string, error) {
	dial := cc.dial
	if dial == nil {
		d := &net.Dialer{}
		dial = d.DialContext
	}
	ctx, cancel := context.WithTimeout(ctx, cc.timeout)
	defer cancel()
	conn, err := dial(ctx, s.addr.Network(), s.addr.String())
	if err != nil {
		// A request that takes a floor first (see awaitGain) fails over
		// on it as on its own dial's: unreachable, not broken.
		return nil, &dialError{err}
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	if _, err := conn.Write([]byte(cmd + "\r\n")); err != nil {
		return nil, err
	}
	// A hostile or broken server is bounded: 64 KiB of reply at most.
	r := bufio.NewReader(&limitedReader{r: conn, n: 64 << 10})
	st := map[string]string{}
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", cmd, err)
		}
		line = bytes.TrimRight(line, "\r\n")
		if bytes.Equal(line, []byte("END")) {
			return st, nil
		}
		if f := bytes.Fields(line); len(f) == 3 && string(f[0]) == "STAT" {
			st[string(f[1])] = string(f[2])
		}
	}
}

// limitedReader is io.LimitReader with an error at the limit, so that an
// endless reply fails instead of looking like its end.
type limitedReader struct {
	r interface{ Read([]byte) (int, error) }
	n int
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errors.New("reply too long")
	}
	if len(p) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= n
	return n, err
}

// replayOnClose replays, before the Client stops, what it logged for each
// server (see invalLog): the keys written elsewhere while the server was out
// for this client, whose older values the server still holds. Lost with the
// Client, they would be served to every other client, and to the next one
// started in this one's place (an application pod that rolls): the server is
// often out for this client alone (timeouts under load), and up for them.
// Each server is tried, out or not, within closeReplayTime timeouts; one
// that fails a delete is given up. A log that overflowed has no keys left to
// replay: its floor was this client's alone (see docs/consistency.md).
func (c *Client) replayOnClose() {
	// The Client's goroutines and context have stopped; nothing it does
	// here starts another (see c.closed).
	ctx, cancel := context.WithTimeout(context.Background(), closeReplayTime*c.cfg.conn.timeout)
	defer cancel()
	c.mu.Lock()
	var ss []*server
	for _, s := range c.servers {
		if s.status() != gone || !s.lost.Load() {
			ss = append(ss, s)
		}
	}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range ss {
		if keys := c.inval.keys(s); len(keys) > 0 {
			wg.Go(func() { c.reportReplay(s, c.replay(ctx, s, keys, nil)) })
		}
	}
	wg.Wait()
}

// closeReplayTime bounds replayOnClose, in timeouts.
const closeReplayTime = 4

// replay cleans keys at s, a few at once (see clean), until one fails
// (failed, if not nil, is told why) or ctx ends, and returns how many it
// cleaned.
func (c *Client) replay(ctx context.Context, s *server, keys map[string][]*server, failed func(error)) int {
	ctx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	work := make(chan string)
	var wg sync.WaitGroup
	var cleaned atomic.Int64
	for range replayWorkers {
		wg.Go(func() {
			for k := range work {
				if ctx.Err() != nil {
					continue
				}
				if err := c.clean(ctx, s, k, false); failureOf(err) != healthy {
					if giveUp(); failed != nil {
						failed(err)
					}
					continue
				}
				cleaned.Add(1)
			}
		})
	}
	for k := range keys {
		work <- k
	}
	close(work)
	wg.Wait()
	return int(cleaned.Load())
}
