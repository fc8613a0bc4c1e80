package ring

import (
	"crypto/md5"
	"encoding/binary"
	"strings"
	"unsafe"
)

// The hashes that Ketama's and Ch3's rings are read with, as the other
// clients compute them; the library's own ring is read with the key's
// xxhash (xxhash.Sum64String). Murmur64A, Ch3's, is in ch3.go.

// MD5Key is libmemcached's hashkit_md5: the first 4 bytes of the key's md5,
// little-endian. md5.Sum only reads the bytes of key, which it is given in
// place, without a copy or an allocation.
func MD5Key(key string) uint32 {
	d := md5.Sum(unsafe.Slice(unsafe.StringData(key), len(key)))
	return binary.LittleEndian.Uint32(d[:4])
}

// RoutingKey is what mcrouter hashes of a key: without a "/region/cluster/"
// routing prefix, and up to its hash stop "|#|" (mcrouter's routingKey).
func RoutingKey(key string) string {
	if len(key) > 0 && key[0] == '/' {
		if i := strings.IndexByte(key[1:], '/'); i >= 0 {
			rest := key[i+2:]
			if j := strings.IndexByte(rest, '/'); j >= 0 {
				key = rest[j+1:]
			}
		}
	}
	if i := strings.Index(key, "|#|"); i >= 0 {
		key = key[:i]
	}
	return key
}
