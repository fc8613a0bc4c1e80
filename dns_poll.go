package selector

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/kubecache/k8s-memcache-selector/internal/dns"
)

// This file keeps a set of members in step with DNS: it looks the name up
// at an interval, turns each answer into members, and publishes a set when
// it changed. A lookup that fails keeps the last set; answers without
// servers empty it only after DNS.Confirmations of them in a row.

// maxTargetLookups is the most SRV targets whose addresses one lookup asks
// for, when the answer's additional section lacks them.
const maxTargetLookups = 256

// dnsConfig is what a dnsSource needs: explicit values, not the options.
type dnsConfig struct {
	target        dnsTarget
	client        dns.Client
	family        string // "IPv4", "IPv6" or "" for either
	interval      time.Duration
	maxTTL        time.Duration // the longest TTL that delays a lookup
	confirmations int           // answers without servers in a row that empty the set; negative: never
	log           *slog.Logger
	metrics       Metrics
	publish       func(ms []member) error
}

// dnsSource runs discovery by DNS for one name. Its fields are used only
// by the goroutine running run, but for stats, which has its own lock.
type dnsSource struct {
	dnsConfig
	stats     stats
	published []member // nil before the first set
	empties   int      // answers without servers in a row
	skipped   string   // the SRV targets last said to be skipped, so as not to repeat it
}

func newDNSSource(cfg dnsConfig) *dnsSource {
	d := &dnsSource{dnsConfig: cfg}
	d.stats.m, d.stats.service = cfg.metrics, cfg.target.addr
	return d
}

// run looks up the name until ctx is done. It closes ready once the first
// answer is published, which an answer without servers is too, so that
// NewServerList returns as it does for a Service without endpoints yet;
// until then a failing lookup is retried sooner than the interval.
func (d *dnsSource) run(ctx context.Context, ready chan<- struct{}) {
	b := backoff{timing: timing{backoffBase: 100 * time.Millisecond, backoffCap: d.interval, backoffReset: time.Minute}}
	for {
		// One lookup, its SRV targets' included, within four times the
		// tries of one query, so that a slow server delays the next only so
		// much.
		lctx, cancel := context.WithTimeout(ctx, 4*2*cmp.Or(d.client.Timeout, dns.DefaultTimeout))
		ms, ttl, err := d.lookup(lctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		d.apply(ms, err)
		wait := d.interval
		switch {
		case d.published == nil:
			wait = min(b.next(), d.interval)
		case !d.stats.get().Synced:
			d.stats.synced()
			close(ready)
		}
		if err == nil && d.published != nil {
			wait = max(wait, min(ttl, d.maxTTL)) // the TTL is a floor, up to maxTTL
		}
		t := time.NewTimer(wait + rand.N(wait/10+1))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

// apply acts on one lookup's result: a failure keeps the servers; an answer
// with servers is published; one without, or NXDOMAIN, is published where
// there are no servers yet, and otherwise counted towards the confirmations
// that empty them.
func (d *dnsSource) apply(ms []member, err error) {
	notFound := errors.Is(err, dns.ErrNotFound)
	switch {
	case err != nil && !notFound:
		err = d.explain(err)
		d.stats.failed(err)
		d.log.Error("DNS lookup failed; keeping the servers and retrying", keyError, err.Error(), keyServers, len(d.published))
		return
	case notFound:
		err = d.explain(err)
		d.stats.failed(err)
	case len(ms) == 0:
		d.stats.heard()
		err = d.explain(errEmptyAnswer)
	default:
		d.stats.heard()
	}
	// err is now why there is no server, if there is none.
	if len(ms) > 0 || len(d.published) == 0 {
		if err != nil && d.published == nil {
			d.log.Warn("DNS has no server for the address yet", keyError, err.Error())
		}
		d.empties = 0
		d.set(ms)
		return
	}
	d.empties++
	if d.confirmations < 0 || d.empties < d.confirmations {
		if d.empties == 1 { // once for a run of them
			d.log.Warn(fmt.Sprintf("DNS answered no server; keeping the servers (%s empty them)", confirmationsText(d.confirmations)),
				keyError, err.Error(), keyServers, len(d.published))
		}
		return
	}
	d.log.Warn(fmt.Sprintf("DNS answered no server %d times in a row; emptying the servers", d.empties), keyError, err.Error())
	d.set(nil)
}

// set publishes ms if they differ from the set published.
func (d *dnsSource) set(ms []member) {
	if ms == nil {
		ms = []member{}
	}
	if d.published != nil && equalMembers(ms, d.published) {
		return
	}
	if err := d.publish(ms); err != nil {
		d.log.Error("refusing DNS's servers; keeping the servers", keyError, err.Error(), keyServers, len(d.published))
		return
	}
	d.published = ms
}

func confirmationsText(n int) string {
	if n < 0 {
		return "none (Confirmations is negative) will"
	}
	return strconv.Itoa(n) + " in a row"
}

// errEmptyAnswer is an answer without servers.
var errEmptyAnswer = errors.New("the DNS answer has no records")

// lookup asks DNS for the members, and the least TTL of the answer.
func (d *dnsSource) lookup(ctx context.Context) ([]member, time.Duration, error) {
	if !d.target.srv {
		return d.lookupA(ctx)
	}
	ans, err := d.client.Lookup(ctx, d.target.name, dns.TypeSRV)
	if err != nil {
		return nil, 0, err
	}
	addrs, err := d.targetAddrs(ctx, ans)
	if err != nil {
		return nil, 0, err
	}
	parent := srvParent(ans.Name)
	var eps []endpoint
	var skipped []string
	for _, r := range ans.Records {
		switch {
		case r.Target == "" || r.Port == 0:
			continue // "." as target: "the service is decidedly not available here" (RFC 2782)
		case !dns.IsHostname(r.Target):
			skipped = append(skipped, strconv.Quote(r.Target)+" is not a hostname")
			continue
		}
		host := r.Target
		if label, ok := strings.CutSuffix(r.Target, "."+parent); ok && parent != "" && !strings.Contains(label, ".") {
			// A Kubernetes pod's name under its headless Service: the
			// hostname alone, as the watch names it, so that both
			// discoveries map keys alike.
			host = label
		}
		port := strconv.Itoa(int(r.Port))
		found := false
		for _, ip := range addrs[r.Target] {
			eps = append(eps, endpoint{addr: net.JoinHostPort(ip, port), hostname: host})
			found = true
		}
		if !found {
			skipped = append(skipped, r.Target+" has no address")
		}
	}
	if s := strings.Join(skipped, "; "); s != d.skipped {
		d.skipped = s
		if s != "" {
			d.log.Warn("skipping SRV targets", keyError, s)
		}
	}
	return union(map[string][]endpoint{"": eps}, d.family), ttlOf(ans.TTL), nil
}

// lookupA asks for the A records of the name, and if there are none (or
// WithIPFamily says IPv6) its AAAA records.
func (d *dnsSource) lookupA(ctx context.Context) ([]member, time.Duration, error) {
	var eps []endpoint
	var ttl uint32
	for _, t := range d.types() {
		ans, err := d.client.Lookup(ctx, d.target.name, t)
		if err != nil {
			return nil, 0, err
		}
		for _, r := range ans.Records {
			eps = append(eps, endpoint{addr: net.JoinHostPort(r.Addr.Unmap().String(), strconv.Itoa(d.target.port))})
		}
		if ttl = ans.TTL; len(eps) > 0 {
			break
		}
	}
	return union(map[string][]endpoint{"": eps}, d.family), ttlOf(ttl), nil
}

// types returns the address record types to ask for, in order.
func (d *dnsSource) types() []dns.Type {
	switch d.family {
	case "IPv4":
		return []dns.Type{dns.TypeA}
	case "IPv6":
		return []dns.Type{dns.TypeAAAA}
	}
	return []dns.Type{dns.TypeA, dns.TypeAAAA}
}

// targetAddrs returns the addresses of the SRV targets of ans, one per
// target and family (the least, so that a target with several keeps one
// address): from the additional section, or for targets it lacks from
// their own lookups, at most maxTargetLookups of them.
func (d *dnsSource) targetAddrs(ctx context.Context, ans dns.Answer) (map[string][]string, error) {
	v4, v6 := map[string]string{}, map[string]string{}
	note := func(r dns.Record) {
		m := v6
		if r.Addr.Unmap().Is4() {
			m = v4
		}
		if ip := r.Addr.Unmap().String(); m[r.Name] == "" || ip < m[r.Name] {
			m[r.Name] = ip
		}
	}
	for _, r := range ans.Additional {
		if r.Type == dns.TypeA || r.Type == dns.TypeAAAA {
			note(r)
		}
	}
	asked := 0
	for _, r := range ans.Records {
		if r.Target == "" || !dns.IsHostname(r.Target) || v4[r.Target] != "" || v6[r.Target] != "" {
			continue
		}
		if asked++; asked > maxTargetLookups {
			return nil, fmt.Errorf("the SRV answer has more than %d targets without addresses in its additional section", maxTargetLookups)
		}
		for _, t := range d.types() {
			a, err := d.client.Lookup(ctx, r.Target+".", t)
			if errors.Is(err, dns.ErrNotFound) {
				break // the target is gone: skipped, and said so
			}
			if err != nil {
				return nil, err
			}
			for _, rr := range a.Records {
				rr.Name = r.Target
				note(rr)
			}
			if len(a.Records) > 0 {
				break
			}
		}
	}
	addrs := make(map[string][]string, len(v4)+len(v6))
	for _, m := range []map[string]string{v4, v6} {
		for name, ip := range m {
			addrs[name] = append(addrs[name], ip)
		}
	}
	return addrs, nil
}

// srvParent returns the name under which an SRV name's targets are pods:
// "svc.ns.svc.cluster.local" for "_port._proto.svc.ns.svc.cluster.local".
func srvParent(name string) string {
	labels := strings.SplitN(name, ".", 3)
	if len(labels) < 3 || !strings.HasPrefix(labels[0], "_") || !strings.HasPrefix(labels[1], "_") {
		return ""
	}
	return labels[2]
}

func ttlOf(s uint32) time.Duration { return time.Duration(s) * time.Second }

// explain returns err with what it means for the address, and the fix.
func (d *dnsSource) explain(err error) error {
	t := d.target
	var de *dns.Error
	errors.As(err, &de)
	switch {
	case errors.Is(err, dns.ErrNotFound) && t.srv:
		return fmt.Errorf("the SRV name does not exist: check the Service's name and namespace, that it is headless (clusterIP: None) and has a port named as the address's first label, and that its pods are ready: %w", err)
	case errors.Is(err, dns.ErrNotFound):
		return fmt.Errorf("the name does not exist: check the Service's name and namespace, that it is headless (clusterIP: None), and that its pods are ready: %w", err)
	case errors.Is(err, errEmptyAnswer) && t.srv:
		return fmt.Errorf("no SRV records for %s: check that the Service has a port named %s with protocol %s and ready pods: %w",
			t.name, strings.TrimPrefix(strings.SplitN(t.name, ".", 2)[0], "_"), strings.ToUpper(strings.TrimPrefix(strings.Split(t.name, ".")[1], "_")), err)
	case errors.Is(err, errEmptyAnswer):
		return fmt.Errorf("no A or AAAA records for %s (or none of WithIPFamily's family): check that the Service has ready pods: %w", t.name, err)
	case errors.Is(err, dns.ErrTimeout) && de != nil:
		return fmt.Errorf("the DNS server %s did not answer in time: check that it is reachable from here (in a pod, the cluster DNS), or give another with WithDNS(DNS{Server: ...}), or a longer Timeout: %w", de.Server, err)
	case errors.Is(err, dns.ErrServerFailure), errors.Is(err, dns.ErrRefused):
		return fmt.Errorf("the DNS server failed the lookup: check that it serves this name (the cluster domain, a forwarding rule): %w", err)
	}
	return err
}
