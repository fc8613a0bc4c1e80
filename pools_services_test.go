package selector

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// serviceSlices returns one EndpointSlice of Service svc for each of ms, on
// its port (named "memcache"), as pods of svc at ip. Discovery refuses
// loopback addresses, so the Client dials them through toLoopback.
func serviceSlices(t *testing.T, svc, ip string, ms []*memcached) []fakeObject {
	var objs []fakeObject
	for i, m := range ms {
		_, p, err := net.SplitHostPort(m.addr)
		require.NoError(t, err)
		n, _ := strconv.Atoi(p)
		s := slice(fmt.Sprintf("%s-%d", svc, i), "IPv4", []fakePort{tcp("memcache", int32(n))},
			ep(ip).pod(fmt.Sprintf("%s-%d", svc, i), ""))
		s.Metadata.Labels["kubernetes.io/service-name"] = svc
		objs = append(objs, s)
	}
	return objs
}

// toLoopback dials port p of any address at 127.0.0.1:p.
var toLoopback = WithDialContext(func(ctx context.Context, network, addr string) (net.Conn, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	return (&net.Dialer{}).DialContext(ctx, network, net.JoinHostPort("127.0.0.1", p))
})

// TestAcrossServices: a pool over two Services, each key on one server of
// each; reads stay in the client's own Service, and the whole of it lost,
// they go on from the other with no error and every key found.
func TestAcrossServices(t *testing.T) {
	own, other := startMemcached(t, 2), startMemcached(t, 2)
	f := newFakeAPI(t)
	f.put(serviceSlices(t, "memcache", "10.0.1.1", own)...)
	f.put(serviceSlices(t, "memcache-b", "10.0.2.1", other)...)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, err := NewClient(ctx, "memcache:memcache", fakeClientOptions(t, f, fastFailover, toLoopback, WithTimeout(300*time.Millisecond),
		WithPool(AcrossServices("memcache-b:memcache")))...)
	require.NoError(t, err)
	defer c.Close()
	require.Len(t, c.Stats().Servers, 4, "the servers of both Services")

	var keys []string
	for i := range 200 {
		keys = append(keys, fmt.Sprint("x", i))
		require.NoError(t, c.Set(&memcache.Item{Key: keys[i], Value: []byte(keys[i])}))
	}
	for _, k := range keys {
		require.Equal(t, 1, holders(own, k), "copies of %s in memcache", k)
		require.Equal(t, 1, holders(other, k), "copies of %s in memcache-b", k)
	}

	// Reads stay in the client's own Service: with the other stopped, they
	// take no time.
	for _, m := range other {
		m.signal(syscall.SIGSTOP)
	}
	start := time.Now()
	for _, k := range keys {
		_, err := c.Get(k)
		require.NoError(t, err)
	}
	require.Less(t, time.Since(start), 300*time.Millisecond, "reads left the client's own Service")
	for _, m := range other {
		m.signal(syscall.SIGCONT)
	}

	// The client's own Service lost whole: reads and writes go on.
	for _, m := range own {
		m.kill()
	}
	for _, k := range keys {
		it, err := c.Get(k)
		require.NoError(t, err, k)
		require.Equal(t, k, string(it.Value))
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("v2")}), k)
	}
	require.NoError(t, c.Delete(keys[0]))
	_, err = c.Get(keys[0])
	require.ErrorIs(t, err, memcache.ErrCacheMiss)
}

func TestAcrossServicesErrors(t *testing.T) {
	_, err := NewClientFromList(new(ServerList), WithPool(AcrossServices("memcache-b:11211")))
	require.ErrorContains(t, err, "AcrossServices needs NewClient")

	f := newFakeAPI(t)
	f.put(v4("a", ep("10.0.0.1")))
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	_, err = NewClient(ctx, "memcache:11211", fakeClientOptions(t, f, WithPool(AcrossServices("memcache:11211")))...)
	require.ErrorContains(t, err, `Service "memcache:11211" given twice`)
	_, err = NewClient(ctx, "memcache:11211", fakeClientOptions(t, f, WithPool(AcrossServices("memcache-b:bad:port")))...)
	require.ErrorContains(t, err, "AcrossServices")
}
