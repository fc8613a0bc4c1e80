package selector

import "github.com/kubecache/k8s-memcache-selector/internal/discovery"

// This file holds the errors of discovery that users test for. They are
// discovery's own values, so that errors.As and errors.Is work on what
// NewServerList returns, on Stats.LastError and on DiscoveryEvent.Err.

// APIError is an error response from the Kubernetes API server, decoded from
// its Status body. Use errors.As to get it from NewServerList's error.
//
// Its fields: StatusCode (the HTTP status, such as 403), Reason (the Status
// reason, such as "Forbidden" or "Expired"), Message (the Status message
// from the server, or its body, cut to 1 KiB), and the request that failed:
// Verb ("list", "watch" or "get"), Resource
// ("endpointslices.discovery.k8s.io" or "endpoints") and Namespace.
type APIError = discovery.APIError

// errNoPort is returned by NewServerList when the Service's endpoints have no
// TCP port matching the address's port: use the pods' port number (the
// Service's targetPort) or the name of a Service port.
var errNoPort = discovery.ErrNoPort
