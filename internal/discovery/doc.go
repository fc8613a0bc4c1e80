// Package discovery finds the members of a memcached Service: by a watch
// of its EndpointSlices (or core/v1 Endpoints) through a small Kubernetes
// REST client of its own, with client-go's reflector semantics; or by
// polling DNS (A/AAAA or SRV records, through internal/dns).
//
// Its output is a set of members (identity, address, zone) and the
// addresses of endpoints that are draining, handed to a Publish callback
// after each change; its state is read with Stats, and each change of
// state told to a Report. It knows nothing of rings, clients or the
// root's options and logs: the root package turns members into ring
// members, Reports into Metrics, and gives it a *slog.Logger that already
// carries the Service's attributes and rate limits errors.
//
// The API: NewWatch and Watch (Run, Stats), NewDNS and DNSSource (Run,
// Stats), Member, Stats, Kind and Report, Timing, ClientConfig; and the
// errors users test for, APIError, which the root re-exports, and ErrNoPort.
package discovery

// The attribute keys of the records discovery logs, as the root's log
// names them.
const (
	keyError   = "error"
	keyServers = "servers"
	keyRetryIn = "retry_in"
)
