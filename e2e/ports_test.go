package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Scenario 7: a multi-port Service whose ports differ from the target
// ports, one of them a named container port; the port in the address is a
// Service port name or a target port number; and the address forms svc,
// svc.ns, svc.ns.svc and svc.ns.svc.cluster.local.
func TestPortsAndAddressForms(t *testing.T) {
	e := newEnv(t)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "mc-ports"},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			Selector:  map[string]string{"app": "mc-ports"},
			Ports: []corev1.ServicePort{
				{Name: "memcache", Port: 11211, TargetPort: intstr.FromString("mc")},
				{Name: "admin", Port: 9100, TargetPort: intstr.FromInt32(9101)},
			},
		},
	}
	if _, err := e.client.CoreV1().Services(e.ns).Create(e.ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := e.runPods(0, 3, podOpts{
		labels: map[string]string{"app": "mc-ports"},
		ports: []corev1.ContainerPort{
			{Name: "mc", ContainerPort: 21211, Protocol: corev1.ProtocolTCP},
			{Name: "admin", ContainerPort: 9101, Protocol: corev1.ProtocolTCP},
		},
	})

	ns := e.ns
	tests := []struct {
		addr string
		port int // the target port the ring must hold
	}{
		{"mc-ports:memcache", 21211}, // Service port name, named targetPort
		{"mc-ports:21211", 21211},    // target port number
		{"mc-ports:admin", 9101},
		{"mc-ports:9101", 9101},
		{"mc-ports." + ns + ":memcache", 21211},
		{"mc-ports." + ns + ".svc:memcache", 21211},
		{"mc-ports." + ns + ".svc.cluster.local:memcache", 21211},
		{"mc-ports." + ns + ".svc.cluster.local:9101", 9101},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			l := e.sub(t).mustLib(tt.addr)
			d := l.waitServers(t, addrs(pods, tt.port), 10*time.Second)
			t.Logf("ring %v after %v", l.servers(), d.Round(time.Millisecond))

			// The key lands on the memcached of that port.
			key := fmt.Sprintf("ports-%d", tt.port)
			if err := newClient(l).Set(&memcache.Item{Key: key, Value: []byte(tt.addr)}); err != nil {
				t.Fatal(err)
			}
			it, err := memcache.New(pick(t, l, key)).Get(key)
			if err != nil || string(it.Value) != tt.addr {
				t.Fatalf("key %s not on %s: %v", key, pick(t, l, key), err)
			}
		})
	}
}
