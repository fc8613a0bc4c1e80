package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

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

// ApplyFile creates the objects of a YAML file in namespace ns, as
// `kubectl create -n ns -f path` does, and returns them as "Kind/name". It
// knows the kinds of examples/kubernetes/rbac.yaml and service.yaml:
// ServiceAccount, Role, RoleBinding and Service.
func ApplyFile(ctx context.Context, client kubernetes.Interface, ns, path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var created []string
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return created, nil
		}
		if err != nil {
			return created, fmt.Errorf("%s: %w", path, err)
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return created, fmt.Errorf("%s: %w", path, err)
		}
		var name string
		switch tm.Kind {
		case "": // only comments
			continue
		case "ServiceAccount":
			obj := &corev1.ServiceAccount{}
			if err = yaml.UnmarshalStrict(doc, obj); err == nil {
				name = obj.Name
				_, err = client.CoreV1().ServiceAccounts(ns).Create(ctx, obj, metav1.CreateOptions{})
			}
		case "Role":
			obj := &rbacv1.Role{}
			if err = yaml.UnmarshalStrict(doc, obj); err == nil {
				name = obj.Name
				_, err = client.RbacV1().Roles(ns).Create(ctx, obj, metav1.CreateOptions{})
			}
		case "RoleBinding":
			obj := &rbacv1.RoleBinding{}
			if err = yaml.UnmarshalStrict(doc, obj); err == nil {
				name = obj.Name
				_, err = client.RbacV1().RoleBindings(ns).Create(ctx, obj, metav1.CreateOptions{})
			}
		case "Service":
			obj := &corev1.Service{}
			if err = yaml.UnmarshalStrict(doc, obj); err == nil {
				name = obj.Name
				_, err = client.CoreV1().Services(ns).Create(ctx, obj, metav1.CreateOptions{})
			}
		default:
			return created, fmt.Errorf("%s: cannot apply kind %q", path, tm.Kind)
		}
		if err != nil {
			return created, fmt.Errorf("%s: %s %s: %w", path, tm.Kind, name, err)
		}
		created = append(created, tm.Kind+"/"+name)
	}
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
