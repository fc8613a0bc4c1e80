package e2e

import (
	"os"
	"path/filepath"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// The Deployments in examples/kubernetes, which the other tests do not run
// (there is no kubelet): the API server accepts them (a server-side dry
// run), the memcached pods match the headless Service, and the app runs as
// the ServiceAccount of rbac.yaml.
func TestExampleManifests(t *testing.T) {
	e := newEnv(t)
	deploy := map[string]*appsv1.Deployment{}
	for _, file := range []string{"memcached.yaml", "app.yaml"} {
		b, err := os.ReadFile(filepath.Join(*manifestsDir, file))
		if err != nil {
			t.Fatal(err)
		}
		d := &appsv1.Deployment{}
		if err := yaml.UnmarshalStrict(b, d); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if _, err := e.client.AppsV1().Deployments(e.ns).Create(e.ctx, d, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Fatalf("%s: the API server rejects it: %v", file, err)
		}
		deploy[file] = d
	}

	mc := deploy["memcached.yaml"].Spec.Template
	if !labels.SelectorFromSet(e.m.Service.Spec.Selector).Matches(labels.Set(mc.Labels)) {
		t.Errorf("memcached.yaml pod labels %v do not match service.yaml's selector %v", mc.Labels, e.m.Service.Spec.Selector)
	}
	target := e.m.Service.Spec.Ports[0].TargetPort
	found := false
	for _, p := range mc.Spec.Containers[0].Ports {
		found = found || int(p.ContainerPort) == target.IntValue() || p.Name == target.String()
	}
	if !found {
		t.Errorf("memcached.yaml has no container port for service.yaml's targetPort %s", target.String())
	}
	if sa := deploy["app.yaml"].Spec.Template.Spec.ServiceAccountName; sa != e.m.ServiceAccount.Name {
		t.Errorf("app.yaml runs as %q, want rbac.yaml's ServiceAccount %q", sa, e.m.ServiceAccount.Name)
	}
}
