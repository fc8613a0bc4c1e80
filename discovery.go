package selector

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"time"

	"github.com/kubecache/k8s-memcache-selector/internal/discovery"
)

// This file is discovery's side of the ServerList: starting the watch of a
// Service or the lookups of a DNS name (internal/discovery runs both), and
// publishing what they find.

// startDiscovery starts the watch of the Service named by addr with o (see
// startWatch), or for a DNS address its lookups (see startDNS), and returns
// its ServerList once the first list is published.
func startDiscovery(ctx context.Context, addr string, o options) (*ServerList, error) {
	if isDNSAddress(addr) {
		return startDNS(ctx, addr, o)
	}
	return startWatch(ctx, addr, o)
}

// toMembers turns discovery's members into the ring's.
func toMembers(ms []discovery.Member) []member {
	rs := make([]member, len(ms))
	for i, m := range ms {
		rs[i] = member{id: m.ID, addr: &staticAddr{network: "tcp", str: m.Addr}, zone: m.Zone}
	}
	return rs
}

// reportDiscovery returns the Report that tells the ServerList's Metrics of
// discovery's changes of state, or nil without Metrics.
func (ss *ServerList) reportDiscovery() discovery.Report {
	if ss.metrics == nil {
		return nil
	}
	m, service := ss.metrics, ss.service
	return func(k discovery.Kind, err error) {
		m.Discovery(DiscoveryEvent{Service: service, Kind: DiscoveryKind(k), Err: err})
	}
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
