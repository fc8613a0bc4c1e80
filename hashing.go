package selector

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"
	hashring "github.com/kubecache/k8s-memcache-selector/internal/ring"
)

// Hashing is how a ServerList maps keys to servers. The zero value is the
// library's own ring (see ServerList), which every Go client of this
// library shares. Ketama and Ch3 are for a pool shared with clients in
// other languages or with a proxy tier: they map every key exactly as
// those do, given the same servers under the same names.
type Hashing struct {
	mode    hashMode
	domain  string            // names from the pods' hostnames: hostname.domain:port (see ByHostname)
	weights map[string]uint32 // ketama weights by name; a name not in it weighs 1
}

type hashMode uint8

const (
	ownRing hashMode = iota
	ketamaMode
	ch3Mode
)

// Ketama is libmemcached's weighted ketama, bit for bit: what php-memcached
// (Memcached::OPT_LIBKETAMA_COMPATIBLE), libmemcached
// (MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED), pylibmc ({"ketama_weighted": True})
// and twemproxy (distribution: ketama, hash: md5) use. A key goes to the
// first of 160 points a server (scaled by weight; 4 to an md5 digest of
// "name-i", or of "host-i" where the port is 11211) at or after the first
// 4 bytes of its md5. Adding or removing a server moves only its share of
// the keys, as on the library's own ring.
//
// A server's name is the one the other clients are given: for SetServers,
// the address as given (in canonical form: see SetServers); for
// NewServerList, the endpoint's ip:port, or with ByHostname its pod's DNS
// name. An IPv6 host is hashed without its brackets, as those clients take
// it ("::1-i", "::1:11212-i").
//
// Where two servers have a point of the same value (in about 1 pool in 30
// at 100 servers, for about 1/160 of one server's keys), the keys that
// reach it go to the server listed first: for SetServers, the first in the
// order given, as in libmemcached and php-memcached given the same list in
// the same order; for discovered servers, the one with the shorter name,
// then the lower byte by byte, as twemproxy orders its servers whatever
// its configuration's order.
func Ketama() Hashing { return Hashing{mode: ketamaMode} }

// Ch3 is mcrouter's ch3 (its default hash, furc_hash): a key's server is an
// index, from the murmur64 of its routing key (the key without a leading
// "/region/cluster/" prefix, cut at "|#|"), into an ordered list of servers.
// The list must be the same, in the same order, as the mcrouter pool's:
//
//   - for SetServers, the order given;
//   - for NewServerList, the pods' ordinals: a StatefulSet's pod name-N is
//     at index N, as in an mcrouter config that lists the StatefulSet's pods
//     by their DNS names. A pod that is not ready leaves a hole, whose keys
//     fail over to other servers, while the other pods keep their indexes.
//
// Ch3 is consistent only at the end of the list: growing it from N to N+1
// servers moves 1/(N+1) of the keys to the new one, and shrinking it from
// the end moves only the last server's; removing a server from the middle
// of a SetServers list shifts the ones after it and moves about half of
// all keys. Scale a StatefulSet, whose pods come and go at the end.
func Ch3() Hashing { return Hashing{mode: ch3Mode} }

// ByHostname names each discovered server by its pod's hostname, as DNS
// has it: hostname.domain:port, where domain is the headless Service's
// (such as "memcache-headless.default.svc.cluster.local": write it as the
// other clients' configuration does). It is for the pods of a StatefulSet,
// whose hostnames and DNS names outlive their IPs; an endpoint without a
// hostname is an error. It changes only the names that Ketama hashes.
func (h Hashing) ByHostname(domain string) Hashing {
	h.domain = strings.TrimSuffix(domain, ".")
	return h
}

// WithWeights gives Ketama servers weights, by name (the names of Ketama);
// a server not in w weighs 1. A server's share of the points is its weight
// over the total, as in libmemcached's weighted mode.
func (h Hashing) WithWeights(w map[string]int) Hashing {
	h.weights = make(map[string]uint32, len(w))
	for name, v := range w {
		h.weights[name] = uint32(max(v, 0))
	}
	return h
}

// WithHashing sets how keys are mapped to the servers; the zero Hashing
// is the default, the library's own ring (see Hashing).
func WithHashing(h Hashing) Option {
	return discoveryOption("WithHashing", func(o *options) { o.hashing = h.clone() })
}

// SetHashing sets how a ServerList for SetServers maps keys: call it on the
// zero value before SetServers (a ServerList from NewServerList takes
// WithHashing).
func (ss *ServerList) SetHashing(h Hashing) error {
	if err := h.check(); err != nil {
		return fmt.Errorf("selector: SetHashing: %w", err)
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.ring.Load() != nil || ss.disc != nil {
		return errors.New("selector: SetHashing: the ServerList has servers already; set the hashing first (NewServerList: WithHashing)")
	}
	ss.hashing = h.clone()
	return nil
}

// check reports a Hashing that cannot work.
func (h Hashing) check() error {
	switch {
	case h.mode == ownRing && (h.domain != "" || h.weights != nil):
		return errors.New("ByHostname and WithWeights are for Ketama or Ch3; the default ring names servers by their identity")
	case h.mode == ch3Mode && h.weights != nil:
		return errors.New("WithWeights is for Ketama: mcrouter's ch3 has no weights (its WeightedCh3 is not supported)")
	}
	for name, w := range h.weights {
		if w == 0 {
			return fmt.Errorf("WithWeights: %q weighs 0; a weight is 1 or more", name)
		}
	}
	return nil
}

// sum returns the hash of key that h's rings are read with.
func (h *Hashing) sum(key string) uint64 {
	switch h.mode {
	case ketamaMode:
		return uint64(hashring.MD5Key(key))
	case ch3Mode:
		return hashring.Murmur64A(hashring.RoutingKey(key))
	}
	return xxhash.Sum64String(key)
}

// name returns m's name under h: what Ketama hashes (see Ketama).
func (h *Hashing) name(m member) (string, error) {
	switch {
	case m.static:
		return m.id, nil
	case h.domain == "":
		return m.addr.str, nil
	}
	host, port, err := net.SplitHostPort(m.id)
	if err != nil || net.ParseIP(host) != nil {
		return "", fmt.Errorf("server %s has no hostname (ByHostname is for a StatefulSet's pods, whose endpoints have one)", m.addr.str)
	}
	return host + "." + h.domain + ":" + port, nil
}

// ordinal returns the N of a StatefulSet pod's name-N in m's identity, for
// Ch3's order.
func ordinal(m member) (int, error) {
	host, _, err := net.SplitHostPort(m.id)
	if err != nil {
		host = m.id
	}
	i := strings.LastIndexByte(host, '-')
	n, err := strconv.Atoi(host[i+1:])
	if i < 0 || err != nil || n < 0 || n >= maxMembers || net.ParseIP(host) != nil {
		return 0, fmt.Errorf("server %s has no ordinal: Ch3 orders servers as a StatefulSet's pods, name-0, name-1, ... (give the order with SetServers otherwise)", m.addr.str)
	}
	return n, nil
}

// clone returns h with its own copy of the weights.
func (h Hashing) clone() Hashing {
	h.weights = maps.Clone(h.weights)
	return h
}
