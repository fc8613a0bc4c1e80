package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// CreateNamespace creates namespace ns with its default ServiceAccount
// (there is no service-account controller; pods need it to pass admission).
func CreateNamespace(ctx context.Context, client kubernetes.Interface, ns string) error {
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	if _, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create ServiceAccount %s/default: %w", ns, err)
	}
	return nil
}

// Manifests are the objects of examples/kubernetes/rbac.yaml and
// service.yaml: the ServiceAccount, Role and RoleBinding a user applies, and
// the headless Service.
type Manifests struct {
	ServiceAccount *corev1.ServiceAccount
	Role           *rbacv1.Role
	RoleBinding    *rbacv1.RoleBinding
	Service        *corev1.Service
}

// LoadManifests parses rbac.yaml and service.yaml in dir (the example
// manifests themselves, not copies) into typed objects, strictly: a field
// the API does not know is an error.
func LoadManifests(dir string) (*Manifests, error) {
	m := &Manifests{}
	for _, file := range []string{"rbac.yaml", "service.yaml"} {
		path := filepath.Join(dir, file)
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			var obj any
			switch tm.Kind {
			case "": // only comments
				continue
			case "ServiceAccount":
				m.ServiceAccount = &corev1.ServiceAccount{}
				obj = m.ServiceAccount
			case "Role":
				m.Role = &rbacv1.Role{}
				obj = m.Role
			case "RoleBinding":
				m.RoleBinding = &rbacv1.RoleBinding{}
				obj = m.RoleBinding
			case "Service":
				m.Service = &corev1.Service{}
				obj = m.Service
			default:
				return nil, fmt.Errorf("%s: unexpected kind %q", path, tm.Kind)
			}
			if err := yaml.UnmarshalStrict(doc, obj); err != nil {
				return nil, fmt.Errorf("%s: %s: %w", path, tm.Kind, err)
			}
		}
	}
	if m.ServiceAccount == nil || m.Role == nil || m.RoleBinding == nil || m.Service == nil {
		return nil, fmt.Errorf("%s: want a ServiceAccount, Role, RoleBinding and Service, got %+v", dir, *m)
	}
	return m, nil
}

// Apply creates copies of the objects in namespace ns, as `kubectl create
// -n ns -f` does.
func (m *Manifests) Apply(ctx context.Context, client kubernetes.Interface, ns string) error {
	sa, role, rb, svc := m.ServiceAccount.DeepCopy(), m.Role.DeepCopy(), m.RoleBinding.DeepCopy(), m.Service.DeepCopy()
	sa.Namespace, role.Namespace, rb.Namespace, svc.Namespace = ns, ns, ns, ns
	if _, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create ServiceAccount %s/%s: %w", ns, sa.Name, err)
	}
	if _, err := client.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Role %s/%s: %w", ns, role.Name, err)
	}
	if _, err := client.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create RoleBinding %s/%s: %w", ns, rb.Name, err)
	}
	if _, err := client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Service %s/%s: %w", ns, svc.Name, err)
	}
	return nil
}

// WriteToken writes a TokenRequest token of ServiceAccount ns/sa, valid for
// an hour, to path (mode 0600), as the kubelet's projected volume does.
func WriteToken(ctx context.Context, client kubernetes.Interface, ns, sa, path string) error {
	tr := &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))}}
	out, err := client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, tr, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("TokenRequest for %s/%s: %w", ns, sa, err)
	}
	return os.WriteFile(path, []byte(out.Status.Token), 0o600)
}
