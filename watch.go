package selector

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kubecache/k8s-memcache-selector/internal/discovery"
)

// This file starts the watch of a Service through the Kubernetes API: the
// root's wiring of internal/discovery's Watch, which lists and watches the
// Service's EndpointSlices with client-go's reflector semantics and hands
// each new set of members to the ServerList (see publish).

// startWatch starts the watch of the Service named by addr with o, and
// returns its ServerList once the first list is published.
func startWatch(ctx context.Context, addr string, o options) (*ServerList, error) {
	if err := checkDNSOptions(o, false); err != nil {
		return nil, err
	}
	t, err := parseTarget(addr, o.getenv, o.saDir)
	if err != nil {
		return nil, err
	}
	log := newLog(o.log, t)
	cfg, err := o.clientConfig()
	if err != nil {
		return nil, err
	}
	ss := &ServerList{points: o.points, hashing: o.hashing, drains: true, zoned: !o.legacy, changed: make(chan struct{}, 1), nonEmpty: make(chan struct{}),
		metrics: o.metrics, service: t.namespace + "/" + t.service}
	w, err := discovery.NewWatch(discovery.WatchConfig{
		Service: t.service, Namespace: t.namespace, Port: t.port, PortName: t.portName, Client: cfg,
		Legacy: o.legacy, Family: o.family, Timing: o.timing, Log: log, Report: ss.reportDiscovery(),
		Publish: func(ms []discovery.Member, draining []string, lag time.Duration) error {
			return ss.publish(toMembers(ms), draining, lag, log)
		}})
	if err != nil {
		return nil, err
	}
	ss.disc = w

	// The watch outlives ctx: it keeps ctx's values but not its cancellation
	// or deadline, and stops on Close.
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ss.stop = cancel
	if o.onChange != nil {
		ss.wg.Go(func() { ss.notify(bg, o.onChange) })
	}
	ready := make(chan error, 1)
	ss.wg.Go(func() { w.Run(bg, ready) })

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
		if last := w.Stats().LastError; last != nil && !errors.Is(err, last) {
			err = fmt.Errorf("%w (last error: %w)", err, last)
		}
		return nil, fmt.Errorf("discover %s: %w", t, err)
	}
	return ss, nil
}
