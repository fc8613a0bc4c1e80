package e2e

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	selector "github.com/kubecache/k8s-memcache-selector"
)

// Scenario 8: the Role in examples/kubernetes/rbac.yaml is sufficient, on
// both the EndpointSlice and the legacy Endpoints path; a Role without list
// or without watch makes NewServerList fail fast with an error that names
// the missing verb; a token of another namespace's ServiceAccount gets a
// clear 403, and a bad token a clear 401.
func TestRBAC(t *testing.T) {
	e := newEnv(t)
	pods := e.runPods(0, 2, podOpts{noProcess: true})
	addr := serviceName + ":11211"

	t.Run("example Role is sufficient", func(t *testing.T) {
		e := e.sub(t)
		for _, legacy := range []bool{false, true} {
			var opts []selector.Option
			if legacy {
				opts = append(opts, selector.WithLegacyEndpoints())
			}
			l := e.mustLib(addr, opts...)
			l.waitServers(t, addrs(pods, 11211), 10*time.Second)
			l.Close()
		}
	})

	// Each verb of the example Role, dropped in turn from a copy of it.
	tests := []struct {
		resource, verb string
		legacy         bool
		required       bool
	}{
		{"endpointslices", "list", false, true},
		{"endpointslices", "watch", false, true},
		{"endpoints", "list", true, true},
		{"endpoints", "watch", true, true},
		{"endpoints", "get", true, false}, // in the Role for compatibility; not used
	}
	for _, tt := range tests {
		name := "without " + tt.verb + " on " + tt.resource
		t.Run(name, func(t *testing.T) {
			e := e.sub(t)
			sa := "no-" + tt.verb + "-" + tt.resource
			e.applyRoleVariant(sa, func(r *rbacv1.PolicyRule) {
				if slices.Contains(r.Resources, tt.resource) {
					r.Verbs = slices.DeleteFunc(r.Verbs, func(v string) bool { return v == tt.verb })
				}
			})
			c := e.defaultConfig()
			c.tokenFile = filepath.Join(t.TempDir(), "token")
			e.writeToken(c.tokenFile, e.ns, sa, nil)
			var opts []selector.Option
			if tt.legacy {
				opts = append(opts, selector.WithLegacyEndpoints())
			}

			start := time.Now()
			l, err := e.newLibWith(c, addr, opts...)
			took := time.Since(start)
			if !tt.required {
				if err != nil {
					t.Fatalf("NewServerList failed without %s, which it should not need: %v", tt.verb, err)
				}
				l.waitServers(t, addrs(pods, 11211), 10*time.Second)
				t.Logf("works without %s on %s: that verb is not needed", tt.verb, tt.resource)
				l.Close()
				return
			}
			if err == nil {
				l.Close()
				t.Fatalf("NewServerList succeeded without %s on %s", tt.verb, tt.resource)
			}
			t.Logf("failed after %v: %v", took.Round(time.Millisecond), err)
			var apiErr *selector.APIError
			if !errors.As(err, &apiErr) {
				t.Fatalf("error is not an *APIError: %T %v", err, err)
			}
			if apiErr.StatusCode != 403 || apiErr.Verb != tt.verb || !strings.HasPrefix(apiErr.Resource, tt.resource) || apiErr.Namespace != e.ns {
				t.Errorf("APIError %+v, want 403 for verb %q on %s in %s", apiErr, tt.verb, tt.resource, e.ns)
			}
			if !strings.Contains(err.Error(), `"`+tt.verb+`"`) || !strings.Contains(err.Error(), tt.resource) {
				t.Errorf("error does not name the missing verb %q on %s: %v", tt.verb, tt.resource, err)
			}
			if took > 10*time.Second {
				t.Errorf("NewServerList took %v to fail; want it to fail fast", took)
			}
		})
	}

	t.Run("token of another namespace", func(t *testing.T) {
		e := e.sub(t)
		other := e.ns + "-other"
		e.createNamespace(other)
		e.applyManifests(other)
		start := time.Now()
		_, err := e.newLib(serviceName + "." + other + ":11211")
		took := time.Since(start)
		if err == nil {
			t.Fatal("NewServerList succeeded across namespaces")
		}
		t.Logf("failed after %v: %v", took.Round(time.Millisecond), err)
		var apiErr *selector.APIError
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 403 || apiErr.Namespace != other {
			t.Fatalf("want a 403 *APIError for namespace %s, got %T %+v", other, err, apiErr)
		}
		if !strings.Contains(err.Error(), other) || !strings.Contains(err.Error(), "forbidden") {
			t.Errorf("error does not say what is forbidden where: %v", err)
		}
		if took > 10*time.Second {
			t.Errorf("NewServerList took %v to fail; want it to fail fast", took)
		}
	})

	t.Run("bad token", func(t *testing.T) {
		e := e.sub(t)
		c := e.defaultConfig()
		c.tokenFile = filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(c.tokenFile, []byte("not-a-token"), 0o600); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err := e.newLibWith(c, addr)
		took := time.Since(start)
		t.Logf("failed after %v: %v", took.Round(time.Millisecond), err)
		var apiErr *selector.APIError
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 {
			t.Fatalf("want a 401 *APIError, got %T %v", err, err)
		}
		if took > 10*time.Second {
			t.Errorf("NewServerList took %v to fail; want it to fail fast", took)
		}
	})
}

// applyRoleVariant creates ServiceAccount, Role and RoleBinding named name:
// copies of the example ones with edit applied to each rule of the Role.
func (e *env) applyRoleVariant(name string, edit func(*rbacv1.PolicyRule)) {
	e.t.Helper()
	sa, role, rb := e.m.ServiceAccount.DeepCopy(), e.m.Role.DeepCopy(), e.m.RoleBinding.DeepCopy()
	for _, o := range []*metav1.ObjectMeta{&sa.ObjectMeta, &role.ObjectMeta, &rb.ObjectMeta} {
		o.Name, o.Namespace = name, e.ns
	}
	for i := range role.Rules {
		edit(&role.Rules[i])
	}
	rb.RoleRef.Name = name
	rb.Subjects = []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: e.ns}}
	ctx := e.ctx
	if _, err := e.client.CoreV1().ServiceAccounts(e.ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.client.RbacV1().Roles(e.ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.client.RbacV1().RoleBindings(e.ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}
