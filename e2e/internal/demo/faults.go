package demo

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/kubecache/k8s-memcache-selector/e2e/internal/cluster"
)

// kill serves POST /kill: memcached in the middle pod dies (SIGKILL) without
// warning (see crash). The request returns at once; the control takes no
// other request until the pod is back.
func (s *control) kill(_ context.Context, _ *http.Request) (string, error) {
	if len(s.pods) == 0 {
		return "", errors.New("no pods to kill")
	}
	p := s.pods[len(s.pods)/2]
	s.crash(p)
	return fmt.Sprintf("killed memcached in %s (%s): NotReady in %v, restarted %v later",
		p.Name, p.Addr(port), s.t.probe, s.t.restart), nil
}

// killZone serves POST /kill-zone?zone=Z: memcached dies (SIGKILL) in every
// pod of zone Z at once, as in a zone's outage, and each pod goes through
// what a killed one does (see crash), at the same time. The request returns
// at once; the control takes no other request until the pods are back.
func (s *control) killZone(_ context.Context, r *http.Request) (string, error) {
	zone := r.URL.Query().Get("zone")
	var pods []*cluster.Pod
	var names []string
	for _, p := range s.pods {
		if s.zoneOf(p) == zone {
			pods = append(pods, p)
			names = append(names, p.Name)
		}
	}
	if len(pods) == 0 {
		return "", fmt.Errorf("zone=%q: no pods there; the zones are %s", zone, strings.Join(zones, ", "))
	}
	s.crash(pods...)
	return fmt.Sprintf("killed memcached in the %d pods of %s (%s): NotReady in %v, restarted %v later",
		len(pods), zone, strings.Join(names, ", "), s.t.probe, s.t.restart), nil
}

// crash kills the memcached of pods (SIGKILL) and plays, in the background,
// what follows: their readiness probes fail after s.t.probe, so the pods
// turn NotReady; the kubelet restarts the containers, empty, s.t.restart
// later; the probes pass, and the pods are Ready again. It holds the
// control's lock until then, so that no other change overlaps.
func (s *control) crash(pods ...*cluster.Pod) {
	for _, p := range pods {
		p.Crash()
	}
	s.background.Go(func() {
		s.mu.Lock() // taken once this request is answered: hold off others until the pods are back
		defer s.mu.Unlock()
		var err error
		each := func(f func(p *cluster.Pod) error) {
			for _, p := range pods {
				if err == nil {
					err = f(p)
				}
			}
		}
		err = sleep(s.bg, s.t.probe)
		each(func(p *cluster.Pod) error { return p.SetReady(s.bg, false) })
		if err == nil {
			err = sleep(s.bg, s.t.restart)
		}
		each(func(p *cluster.Pod) error { return p.RestartProcesses(s.bg) })
		each(func(p *cluster.Pod) error { return p.SetReady(s.bg, true) })
		// The program waits for the pods, and fails after a while if they
		// never return: say why. (Not when the run ends, which cancels s.bg.)
		if err != nil && s.bg.Err() == nil {
			fmt.Fprintf(s.c.Out, "  control: after the kill: %v\n", err)
		}
	})
}
