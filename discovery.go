package selector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"time"
)

// This file is discovery's side of the ServerList: starting the watch of a
// Service, and publishing what it finds.

// startDiscovery starts the watch of the Service named by addr with o, or
// for a DNS address its lookups (see startDNS), and returns its ServerList
// once the first list is published.
func startDiscovery(ctx context.Context, addr string, o options) (*ServerList, error) {
	if isDNSAddress(addr) {
		return startDNS(ctx, addr, o)
	}
	if err := checkDNSOptions(o, false); err != nil {
		return nil, err
	}
	t, err := parseTarget(addr, o.getenv, o.saDir)
	if err != nil {
		return nil, err
	}
	log := newLog(o.log, t)
	cfg, err := o.clientConfig(log)
	if err != nil {
		return nil, err
	}
	c, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	ss := &ServerList{points: o.points, hashing: o.hashing, drains: true, changed: make(chan struct{}, 1), nonEmpty: make(chan struct{}),
		metrics: o.metrics, service: t.namespace + "/" + t.service}
	ss.w = newWatcher(c, watchConfig{target: t, legacy: o.legacy, family: o.family, timing: o.timing, log: log, metrics: o.metrics,
		publish: func(ms []member, draining []string, lag time.Duration) error {
			return ss.publish(ms, draining, lag, log)
		}})
	ss.disc = &ss.w.stats

	// The watch outlives ctx: it keeps ctx's values but not its cancellation
	// or deadline, and stops on Close.
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ss.stop = cancel
	if o.onChange != nil {
		ss.wg.Go(func() { ss.notify(bg, o.onChange) })
	}
	ready := make(chan error, 1)
	ss.wg.Go(func() { ss.w.run(bg, ready) })

	select {
	case err = <-ready:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err == nil && o.waitReady {
		select {
		case <-ss.nonEmpty:
		case <-ctx.Done():
			err = fmt.Errorf("%w: the Service has no ready endpoints (WithWaitForServers)", ctx.Err())
		}
	}
	if err != nil {
		ss.Close()
		if last := ss.w.stats.get().LastError; last != nil && !errors.Is(err, last) {
			err = fmt.Errorf("%w (last error: %w)", err, last)
		}
		return nil, fmt.Errorf("discover %s: %w", t, err)
	}
	return ss, nil
}

// publish makes ms, from discovery, the servers, logs and reports the
// change (lag as RingEvent's) and signals the change hook. The first set is
// always signalled, even if empty. A set that update refuses is returned as
// an error.
func (ss *ServerList) publish(ms []member, draining []string, lag time.Duration, log *slog.Logger) error {
	// The servers that start draining are added before the ring changes,
	// and the ones that stop are dropped after: a subscriber woken by a ring
	// without a terminating server must find it draining, or it takes the
	// server for one that no longer serves, and hands none of its keys off.
	ss.setDraining(slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(ss.drainingSet()), draining...)))))
	added, removed, err := ss.update(ms)
	ss.setDraining(draining)
	if err != nil {
		return err
	}
	first := !ss.discovered
	ss.discovered = true
	n := len(ss.Servers())
	if added != nil || removed != nil {
		log.Info("servers changed", keyServers, n, keyAdded, added, keyRemoved, removed)
		ss.reportRing(added, removed, lag)
	}
	if n > 0 {
		select {
		case <-ss.nonEmpty:
		default:
			close(ss.nonEmpty)
		}
	}
	if added != nil || removed != nil || first {
		select {
		case ss.changed <- struct{}{}:
		default: // a notification is already pending; it will see these servers
		}
	}
	return nil
}

// notify calls f with the current servers after every change, until ctx is
// done. Changes that come faster than f returns are coalesced: f always sees
// the latest set.
func (ss *ServerList) notify(ctx context.Context, f func([]net.Addr)) {
	for {
		select {
		case <-ss.changed:
			runCallback(func() { f(ss.Servers()) })
		case <-ctx.Done():
			return
		}
	}
}
