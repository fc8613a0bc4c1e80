package discovery

import (
	"maps"
	"net/url"
)

// resource is what a watcher lists and watches: the Service's
// EndpointSlices, or on old clusters its core/v1 Endpoints. It is chosen
// once, and again only if the watcher falls back.
type resource struct {
	path     string     // the collection
	req      request    // names it in errors
	selector url.Values // the Service's objects in it
	listKind string     // the kind of a LIST's answer
	noun     string     // for messages
	legacy   bool       // core/v1 Endpoints
}

func resourceFor(t target, legacy bool) resource {
	if legacy {
		return resource{
			path:     "/api/v1/namespaces/" + t.namespace + "/endpoints",
			req:      request{resource: "endpoints", namespace: t.namespace},
			selector: url.Values{"fieldSelector": {"metadata.name=" + t.service}},
			listKind: "EndpointsList", noun: "Endpoints", legacy: true,
		}
	}
	return resource{
		path:     "/apis/discovery.k8s.io/v1/namespaces/" + t.namespace + "/endpointslices",
		req:      request{resource: "endpointslices.discovery.k8s.io", namespace: t.namespace},
		selector: url.Values{"labelSelector": {"kubernetes.io/service-name=" + t.service}},
		listKind: "EndpointSliceList", noun: "EndpointSlices",
	}
}

// request returns the request for verb, and its query: the selector and
// the given parameters.
func (r resource) request(verb string, params ...string) (request, url.Values) {
	req := r.req
	req.verb = verb
	q := maps.Clone(r.selector)
	for i := 0; i+1 < len(params); i += 2 {
		q.Set(params[i], params[i+1])
	}
	return req, q
}

// target is the Service a watch follows, from the root's parsed address.
type target struct {
	service, namespace string
	port               int    // the target port number, or 0 if portName is set
	portName           string // the Service port name
}
