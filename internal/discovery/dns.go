package discovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
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

// DNSTarget is the name a DNSSource looks up, from the root's parsed
// address.
type DNSTarget struct {
	Addr string // as given, for messages
	Name string // the name to ask for
	SRV  bool   // SRV records of Name; else A or AAAA records of Name
	Port int    // the servers' port, for A and AAAA
}

// DNSConfig is what a DNSSource needs: explicit values, not the root's
// options.
type DNSConfig struct {
	Target        DNSTarget
	Client        dns.Client
	Family        string        // "IPv4", "IPv6" or "" for either
	Interval      time.Duration // between lookups
	MaxTTL        time.Duration // the longest TTL that delays a lookup
	Confirmations int           // answers without servers in a row that empty the set; negative: never
	Log           *slog.Logger
	Report        Report // nil for none
	// Publish takes the members after the first answer and after every
	// change. A set it refuses is logged, and the last set stays.
	Publish func(ms []Member) error
}

// DNSSource runs discovery by DNS for one name. Its fields are used only
// by the goroutine running Run, but for stats, which has its own lock.
type DNSSource struct {
	DNSConfig
	stats     stats
	published []Member // nil before the first set
	empties   int      // answers without servers in a row
	skipped   string   // the SRV targets last said to be skipped, so as not to repeat it
}

// NewDNS returns the DNSSource of cfg. Run starts it.
func NewDNS(cfg DNSConfig) *DNSSource {
	d := &DNSSource{DNSConfig: cfg}
	d.stats.report = cfg.Report
	return d
}

// Stats returns the state of the lookups. It is safe to call from any
// goroutine.
func (d *DNSSource) Stats() Stats { return d.stats.get() }

// Run looks up the name until ctx is done. It closes ready once the first
// answer is published, which an answer without servers is too, so that
// NewServerList returns as it does for a Service without endpoints yet;
// until then a failing lookup is retried sooner than the interval.
func (d *DNSSource) Run(ctx context.Context, ready chan<- struct{}) {
	b := backoff{Timing: Timing{BackoffBase: 100 * time.Millisecond, BackoffCap: d.Interval, BackoffReset: time.Minute}}
	for {
		// One lookup, its SRV targets' included, within four times the
		// tries of one query, so that a slow server delays the next only so
		// much.
		lctx, cancel := context.WithTimeout(ctx, 4*2*cmp.Or(d.Client.Timeout, dns.DefaultTimeout))
		ms, ttl, err := d.lookup(lctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		d.apply(ms, err)
		wait := d.Interval
		switch {
		case d.published == nil:
			wait = min(b.next(), d.Interval)
		case !d.stats.get().Synced:
			d.stats.synced()
			close(ready)
		}
		if err == nil && d.published != nil {
			wait = max(wait, min(ttl, d.MaxTTL)) // the TTL is a floor, up to maxTTL
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
func (d *DNSSource) apply(ms []Member, err error) {
	notFound := errors.Is(err, dns.ErrNotFound)
	switch {
	case err != nil && !notFound:
		err = d.explain(err)
		d.stats.failed(err)
		d.Log.Error("DNS lookup failed; keeping the servers and retrying", keyError, err.Error(), keyServers, len(d.published))
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
			d.Log.Warn("DNS has no server for the address yet", keyError, err.Error())
		}
		d.empties = 0
		d.set(ms)
		return
	}
	d.empties++
	if d.Confirmations < 0 || d.empties < d.Confirmations {
		if d.empties == 1 { // once for a run of them
			d.Log.Warn(fmt.Sprintf("DNS answered no server; keeping the servers (%s empty them)", confirmationsText(d.Confirmations)),
				keyError, err.Error(), keyServers, len(d.published))
		}
		return
	}
	d.Log.Warn(fmt.Sprintf("DNS answered no server %d times in a row; emptying the servers", d.empties), keyError, err.Error())
	d.set(nil)
}

// set publishes ms if they differ from the set published.
func (d *DNSSource) set(ms []Member) {
	if ms == nil {
		ms = []Member{}
	}
	if d.published != nil && slices.Equal(ms, d.published) {
		return
	}
	if err := d.Publish(ms); err != nil {
		d.Log.Error("refusing DNS's servers; keeping the servers", keyError, err.Error(), keyServers, len(d.published))
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
func (d *DNSSource) lookup(ctx context.Context) ([]Member, time.Duration, error) {
	if !d.Target.SRV {
		return d.lookupA(ctx)
	}
	ans, err := d.Client.Lookup(ctx, d.Target.Name, dns.TypeSRV)
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
			d.Log.Warn("skipping SRV targets", keyError, s)
		}
	}
	return union(map[string][]endpoint{"": eps}, d.Family), ttlOf(ans.TTL), nil
}

// lookupA asks for the A records of the name, and if there are none (or
// WithIPFamily says IPv6) its AAAA records.
func (d *DNSSource) lookupA(ctx context.Context) ([]Member, time.Duration, error) {
	var eps []endpoint
	var ttl uint32
	for _, t := range d.types() {
		ans, err := d.Client.Lookup(ctx, d.Target.Name, t)
		if err != nil {
			return nil, 0, err
		}
		for _, r := range ans.Records {
			eps = append(eps, endpoint{addr: net.JoinHostPort(r.Addr.Unmap().String(), strconv.Itoa(d.Target.Port))})
		}
		if ttl = ans.TTL; len(eps) > 0 {
			break
		}
	}
	return union(map[string][]endpoint{"": eps}, d.Family), ttlOf(ttl), nil
}

// types returns the address record types to ask for, in order.
func (d *DNSSource) types() []dns.Type {
	switch d.Family {
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
func (d *DNSSource) targetAddrs(ctx context.Context, ans dns.Answer) (map[string][]string, error) {
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
			a, err := d.Client.Lookup(ctx, r.Target+".", t)
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
func (d *DNSSource) explain(err error) error {
	t := d.Target
	var de *dns.Error
	errors.As(err, &de)
	switch {
	case errors.Is(err, dns.ErrNotFound) && t.SRV:
		return fmt.Errorf("the SRV name does not exist: check the Service's name and namespace, that it is headless (clusterIP: None) and has a port named as the address's first label, and that its pods are ready: %w", err)
	case errors.Is(err, dns.ErrNotFound):
		return fmt.Errorf("the name does not exist: check the Service's name and namespace, that it is headless (clusterIP: None), and that its pods are ready: %w", err)
	case errors.Is(err, errEmptyAnswer) && t.SRV:
		return fmt.Errorf("no SRV records for %s: check that the Service has a port named %s with protocol %s and ready pods: %w",
			t.Name, strings.TrimPrefix(strings.SplitN(t.Name, ".", 2)[0], "_"), strings.ToUpper(strings.TrimPrefix(strings.Split(t.Name, ".")[1], "_")), err)
	case errors.Is(err, errEmptyAnswer):
		return fmt.Errorf("no A or AAAA records for %s (or none of WithIPFamily's family): check that the Service has ready pods: %w", t.Name, err)
	case errors.Is(err, dns.ErrTimeout) && de != nil:
		return fmt.Errorf("the DNS server %s did not answer in time: check that it is reachable from here (in a pod, the cluster DNS), or give another with WithDNS(DNS{Server: ...}), or a longer Timeout: %w", de.Server, err)
	case errors.Is(err, dns.ErrServerFailure), errors.Is(err, dns.ErrRefused):
		return fmt.Errorf("the DNS server failed the lookup: check that it serves this name (the cluster domain, a forwarding rule): %w", err)
	}
	return err
}
