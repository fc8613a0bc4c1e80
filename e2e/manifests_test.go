package e2e

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
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

// memcached-by-zone.yaml, a Service and a Deployment per zone for
// selector.AcrossServices: the API server accepts them, and each
// Deployment's pods are those of its Service only, pinned to its zone.
func TestExampleManifestsByZone(t *testing.T) {
	e := newEnv(t)
	b, err := os.ReadFile(filepath.Join(*manifestsDir, "memcached-by-zone.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	svcs := map[string]*corev1.Service{}
	var deps []*appsv1.Deployment
	for _, doc := range strings.Split(string(b), "\n---\n")[1:] {
		var kind struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &kind); err != nil {
			t.Fatal(err)
		}
		dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
		switch kind.Kind {
		case "Service":
			s := &corev1.Service{}
			if err := yaml.UnmarshalStrict([]byte(doc), s); err != nil {
				t.Fatal(err)
			}
			if _, err := e.client.CoreV1().Services(e.ns).Create(e.ctx, s, dry); err != nil {
				t.Fatalf("Service %s: the API server rejects it: %v", s.Name, err)
			}
			svcs[s.Name] = s
		case "Deployment":
			d := &appsv1.Deployment{}
			if err := yaml.UnmarshalStrict([]byte(doc), d); err != nil {
				t.Fatal(err)
			}
			if _, err := e.client.AppsV1().Deployments(e.ns).Create(e.ctx, d, dry); err != nil {
				t.Fatalf("Deployment %s: the API server rejects it: %v", d.Name, err)
			}
			deps = append(deps, d)
		default:
			t.Fatalf("memcached-by-zone.yaml: unexpected kind %q", kind.Kind)
		}
	}
	if len(svcs) != 3 || len(deps) != 3 {
		t.Fatalf("memcached-by-zone.yaml: %d Services and %d Deployments, want 3 of each", len(svcs), len(deps))
	}
	for _, d := range deps {
		pods := labels.Set(d.Spec.Template.Labels)
		for name, s := range svcs {
			if match := labels.SelectorFromSet(s.Spec.Selector).Matches(pods); match != (name == d.Name) {
				t.Errorf("Deployment %s's pods: Service %s selects them: %v", d.Name, name, match)
			}
		}
		zone := strings.TrimPrefix(d.Name, "memcache-")
		a := d.Spec.Template.Spec.Affinity
		if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil ||
			a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Values[0] != zone {
			t.Errorf("Deployment %s is not pinned to %s", d.Name, zone)
		}
	}
}

// statefulset.yaml, memcached as a StatefulSet with its headless Service
// and the app's RBAC in one file: the API server accepts every object (a
// server-side dry run, in a namespace of its own, as the file uses the
// names of service.yaml and rbac.yaml, which newEnv has applied); the
// Service is headless and selects the StatefulSet's pods; the StatefulSet
// is governed by it (serviceName, which gives the pods' endpoints their
// hostnames); its container has the Service's targetPort; the RBAC is
// rbac.yaml's; and app.yaml runs as its ServiceAccount.
func TestExampleManifestsStatefulSet(t *testing.T) {
	e := newEnv(t)
	ns := e.ns + "-sts"
	e.createNamespace(ns)
	b, err := os.ReadFile(filepath.Join(*manifestsDir, "statefulset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	var (
		svc  *corev1.Service
		sts  *appsv1.StatefulSet
		sa   *corev1.ServiceAccount
		role *rbacv1.Role
		rb   *rbacv1.RoleBinding
	)
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var kind struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &kind); err != nil {
			t.Fatal(err)
		}
		var err error
		switch kind.Kind {
		case "Service":
			svc = &corev1.Service{}
			if err = yaml.UnmarshalStrict([]byte(doc), svc); err == nil {
				_, err = e.client.CoreV1().Services(ns).Create(e.ctx, svc, dry)
			}
		case "StatefulSet":
			sts = &appsv1.StatefulSet{}
			if err = yaml.UnmarshalStrict([]byte(doc), sts); err == nil {
				_, err = e.client.AppsV1().StatefulSets(ns).Create(e.ctx, sts, dry)
			}
		case "ServiceAccount":
			sa = &corev1.ServiceAccount{}
			if err = yaml.UnmarshalStrict([]byte(doc), sa); err == nil {
				_, err = e.client.CoreV1().ServiceAccounts(ns).Create(e.ctx, sa, dry)
			}
		case "Role":
			role = &rbacv1.Role{}
			if err = yaml.UnmarshalStrict([]byte(doc), role); err == nil {
				_, err = e.client.RbacV1().Roles(ns).Create(e.ctx, role, dry)
			}
		case "RoleBinding":
			rb = &rbacv1.RoleBinding{}
			if err = yaml.UnmarshalStrict([]byte(doc), rb); err == nil {
				_, err = e.client.RbacV1().RoleBindings(ns).Create(e.ctx, rb, dry)
			}
		default:
			t.Fatalf("statefulset.yaml: unexpected kind %q", kind.Kind)
		}
		if err != nil {
			t.Fatalf("statefulset.yaml: %s: the API server rejects it: %v", kind.Kind, err)
		}
	}
	if svc == nil || sts == nil || sa == nil || role == nil || rb == nil {
		t.Fatalf("statefulset.yaml: want a Service, a StatefulSet, a ServiceAccount, a Role and a RoleBinding")
	}

	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service %s is not headless (clusterIP %q)", svc.Name, svc.Spec.ClusterIP)
	}
	if sts.Spec.ServiceName != svc.Name {
		t.Errorf("StatefulSet %s: serviceName %q, want the headless Service %q", sts.Name, sts.Spec.ServiceName, svc.Name)
	}
	pod := sts.Spec.Template
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) {
		t.Errorf("StatefulSet pod labels %v do not match the Service's selector %v", pod.Labels, svc.Spec.Selector)
	}
	target := svc.Spec.Ports[0].TargetPort
	found := false
	for _, p := range pod.Spec.Containers[0].Ports {
		found = found || int(p.ContainerPort) == target.IntValue() || p.Name == target.String()
	}
	if !found {
		t.Errorf("the StatefulSet's container has no port for the Service's targetPort %s", target.String())
	}
	if pod.Spec.Containers[0].ReadinessProbe == nil {
		t.Errorf("the StatefulSet's container has no readiness probe: a pod would join the ring before memcached listens")
	}

	if sa.Name != e.m.ServiceAccount.Name || role.Name != e.m.Role.Name || rb.Name != e.m.RoleBinding.Name {
		t.Errorf("RBAC names %s, %s, %s; want rbac.yaml's %s, %s, %s", sa.Name, role.Name, rb.Name,
			e.m.ServiceAccount.Name, e.m.Role.Name, e.m.RoleBinding.Name)
	}
	if !reflect.DeepEqual(role.Rules, e.m.Role.Rules) {
		t.Errorf("the Role's rules %+v differ from rbac.yaml's %+v", role.Rules, e.m.Role.Rules)
	}
	if !reflect.DeepEqual(rb.RoleRef, e.m.RoleBinding.RoleRef) || !reflect.DeepEqual(rb.Subjects, e.m.RoleBinding.Subjects) {
		t.Errorf("the RoleBinding (%+v to %+v) differs from rbac.yaml's (%+v to %+v)", rb.RoleRef, rb.Subjects,
			e.m.RoleBinding.RoleRef, e.m.RoleBinding.Subjects)
	}

	b, err = os.ReadFile(filepath.Join(*manifestsDir, "app.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	app := &appsv1.Deployment{}
	if err := yaml.UnmarshalStrict(b, app); err != nil {
		t.Fatalf("app.yaml: %v", err)
	}
	if got := app.Spec.Template.Spec.ServiceAccountName; got != sa.Name {
		t.Errorf("app.yaml runs as %q, want statefulset.yaml's ServiceAccount %q", got, sa.Name)
	}
}
