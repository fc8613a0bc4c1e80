package selector

import (
	"net"

	"github.com/kubecache/k8s-memcache-selector/internal/discovery"
)

// This file resolves where the Kubernetes API server is and how to reach
// it, from the options or a pod's environment. The REST client itself is
// internal/discovery's.

// clientConfig resolves the API server and its credentials: the options
// given, or in a pod (without WithAPIServer) the in-cluster configuration.
func (o options) clientConfig() (discovery.ClientConfig, error) {
	cfg := discovery.ClientConfig{Server: o.apiServer, TokenFile: o.tokenFile, CAFile: o.caFile, HTTPClient: o.httpClient}
	if o.apiServer != "" {
		return cfg, nil
	}
	host, port := o.getenv("KUBERNETES_SERVICE_HOST"), o.getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return cfg, ErrNotInCluster
	}
	cfg.Server = "https://" + net.JoinHostPort(host, port)
	if cfg.TokenFile == "" {
		cfg.TokenFile = o.saDir + "/token"
	}
	if cfg.CAFile == "" {
		cfg.CAFile = o.saDir + "/ca.crt"
	}
	return cfg, nil
}
