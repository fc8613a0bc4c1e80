package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// control is the client of the demo's control, which changes the cluster
// for the program: see the package comment.
type control struct{ url string }

// do POSTs to path and returns the line the control answers.
func (c control) do(path string) (string, error) {
	resp, err := http.Post(c.url+path, "text/plain", nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("control: POST %s: %s: %s", path, resp.Status, strings.TrimSpace(string(b)))
	}
	return strings.TrimSpace(string(b)), nil
}

// serversInAPIOrder returns the ready addresses of the Service's pods in the
// order the API lists them: how github.com/castai/k8s-memcache-selector,
// which this library replaces, filled its memcache.ServerList. It lists the EndpointSlices itself, with the same
// ServiceAccount, until it finds want addresses.
func serversInAPIOrder(c config, want int) ([]string, error) {
	eps, err := readyEndpoints(c, want)
	if err != nil {
		return nil, err
	}
	var got []string
	for _, ep := range eps {
		got = append(got, ep.addr)
	}
	return got, nil
}

// endpoint is a ready address of the Service, as its EndpointSlices list it.
type endpoint struct {
	addr string // ip:port
	pod  string // targetRef.name
	zone string // its node's zone, which the EndpointSlice controller fills in
}

// readyEndpoints lists the Service's EndpointSlices, with the program's
// ServiceAccount, until they have want ready addresses, and returns them in
// the order the API lists them.
func readyEndpoints(c config, want int) ([]endpoint, error) {
	host, port, err := net.SplitHostPort(c.service)
	if err != nil {
		return nil, err
	}
	service, namespace, _ := strings.Cut(host, ".")
	namespace, _, _ = strings.Cut(namespace, ".")
	ca, err := os.ReadFile(c.ca)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}},
	}
	u := fmt.Sprintf("%s/apis/discovery.k8s.io/v1/namespaces/%s/endpointslices?labelSelector=%s",
		c.api, namespace, url.QueryEscape("kubernetes.io/service-name="+service))

	var got []endpoint
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		token, err := os.ReadFile(c.token)
		if err != nil {
			return nil, err
		}
		req, err := http.NewRequest("GET", u, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		var list struct {
			Items []struct {
				Endpoints []struct {
					Addresses  []string `json:"addresses"`
					Conditions struct {
						Ready *bool `json:"ready"`
					} `json:"conditions"`
					Zone      string `json:"zone"`
					TargetRef struct {
						Name string `json:"name"`
					} `json:"targetRef"`
				} `json:"endpoints"`
			} `json:"items"`
		}
		err = json.NewDecoder(resp.Body).Decode(&list)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("list EndpointSlices: %s: %w", resp.Status, err)
		}
		got = nil
		for _, slice := range list.Items {
			for _, ep := range slice.Endpoints {
				if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
					for _, a := range ep.Addresses {
						got = append(got, endpoint{addr: net.JoinHostPort(a, port), pod: ep.TargetRef.Name, zone: ep.Zone})
					}
				}
			}
		}
		if len(got) == want {
			return got, nil
		}
	}
	return nil, fmt.Errorf("the EndpointSlices of %s list %d ready addresses, not %d: %v", c.service, len(got), want, got)
}
