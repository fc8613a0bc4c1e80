package cluster

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ZoneLabel is the well-known label of a Node's zone, which the
// EndpointSlice controller copies into each endpoint's zone field.
const ZoneLabel = corev1.LabelTopologyZone // "topology.kubernetes.io/zone"

// CreateNode creates a Node named name, with the hostname label and the
// given labels (e.g. ZoneLabel), for pods to be bound to with
// PodSpec.NodeName. Nodes are cluster-wide and outlive a test's namespace:
// a Node that exists already is kept if its labels are the same, and is an
// error otherwise, so that two tests cannot disagree on a node's zone.
//
// The Node has no status (the suite runs no node lifecycle controller, so
// nothing taints it or evicts its pods); the EndpointSlice controller only
// reads its labels.
func (k *Kubelet) CreateNode(ctx context.Context, name string, labels map[string]string) error {
	all := map[string]string{corev1.LabelHostname: name}
	for l, v := range labels {
		all[l] = v
	}
	nodes := k.api().CoreV1().Nodes()
	_, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: all}}, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		if err != nil {
			return fmt.Errorf("create node %s: %w", name, err)
		}
		return nil
	}
	n, err := nodes.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get node %s: %w", name, err)
	}
	for l, v := range all {
		if n.Labels[l] != v {
			return fmt.Errorf("node %s exists with label %s=%q, want %q", name, l, n.Labels[l], v)
		}
	}
	return nil
}

// CreateZonedNodes creates one Node per zone, named prefix-zone, labelled
// with ZoneLabel=zone, and returns their names in the zones' order.
func (k *Kubelet) CreateZonedNodes(ctx context.Context, prefix string, zones ...string) ([]string, error) {
	names := make([]string, len(zones))
	for i, z := range zones {
		names[i] = prefix + "-" + z
		if err := k.CreateNode(ctx, names[i], map[string]string{ZoneLabel: z}); err != nil {
			return nil, err
		}
	}
	return names, nil
}
