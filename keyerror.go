package selector

import (
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/bradfitz/gomemcache/memcache"
)

// maxKeyLen is the longest key memcached takes, in bytes.
const maxKeyLen = 250

// shownKey is how much of a key an error quotes, in bytes: enough to tell
// keys apart, not so much that a 250-byte key fills the log line.
const shownKey = 64

// checkKey returns nil if memcached takes key: 1 to 250 bytes, with no
// spaces or control characters (gomemcache's rule, plus the empty key,
// which memcached answers with ERROR). Else it returns a
// *malformedKeyError that says which rule key breaks. A good key costs a
// loop and no allocation: the error is built only for a bad one.
func checkKey(key string) error {
	if len(key) == 0 || len(key) > maxKeyLen {
		return &malformedKeyError{key: key, at: -1}
	}
	for i := 0; i < len(key); i++ {
		if b := key[i]; b <= ' ' || b == 0x7f {
			return &malformedKeyError{key: key, at: i}
		}
	}
	return nil
}

// legalKey reports whether memcached takes key (see checkKey).
func legalKey(key string) bool { return checkKey(key) == nil }

// malformedKeyError is memcache.ErrMalformedKey for one key. gomemcache's
// error names neither the key nor the rule it breaks; this one says both
// (the key quoted, cut at 64 bytes). errors.Is(err,
// memcache.ErrMalformedKey) holds; err == memcache.ErrMalformedKey does not.
type malformedKeyError struct {
	key string
	at  int // the offset of the first byte memcached refuses; -1 for a key of the wrong length
}

func (e *malformedKeyError) Error() string {
	q := quoteKey(e.key)
	switch {
	case len(e.key) == 0:
		return "selector: malformed key \"\": a key is 1 to 250 bytes"
	case e.at < 0:
		return fmt.Sprintf("selector: malformed key %s: %d bytes, over memcached's limit of %d", q, len(e.key), maxKeyLen)
	case e.key[e.at] == ' ':
		return fmt.Sprintf("selector: malformed key %s: a space at byte %d (memcached keys have no spaces or control characters)", q, e.at)
	}
	return fmt.Sprintf("selector: malformed key %s: control character %#02x at byte %d (memcached keys have no spaces or control characters)", q, e.key[e.at], e.at)
}

func (e *malformedKeyError) Unwrap() error { return memcache.ErrMalformedKey }

// quoteKey returns key quoted, its first 64 bytes only (at a character's
// start) and "..." after them if it is longer.
func quoteKey(key string) string {
	if len(key) <= shownKey {
		return strconv.Quote(key)
	}
	n := shownKey
	for n > 0 && !utf8.RuneStart(key[n]) {
		n--
	}
	return strconv.Quote(key[:n]) + "..."
}

// valueTooLargeError is a value not sent because it is larger than its
// server stores: memcached would read it all and answer SERVER_ERROR
// object too large for cache. The error gives the value's size and the
// server's limit, its item_size_max (memcached's -I), which the Client
// reads at its first contact with each server; for a server that did not
// say, or has no meta protocol, the value is sent and the server's answer
// returned, as before. It matches no sentinel, as the server's answer
// through gomemcache does not.
//
// It is a refusal, as the server's would be: the server stays in, and the
// request is not tried elsewhere (see failureOf). As after memcached's own
// refusal, the key's old value is deleted after a set (see answered), and
// kept after the other modes.
type valueTooLargeError struct {
	key   string
	size  int    // the value's, in bytes
	limit int64  // the server's item_size_max
	addr  string // the server's
	kept  bool   // the key's old value stays: the operation was not a set (see opKind.keepsOnRefusal)
}

func (e *valueTooLargeError) Error() string {
	return fmt.Sprintf("selector: value of key %s not sent: %d bytes, over the largest item memcached at %s stores (%d bytes, its item_size_max, set by -I)",
		quoteKey(e.key), e.size, e.addr, e.limit)
}

// fits returns a *valueTooLargeError if r stores a value larger than s
// stores, once s's limit is known (see valueTooLargeError), and nil
// otherwise. A value within the limit may still be refused: the limit
// counts the item's header and key too, which the server knows best.
func (s *server) fits(r *keyOp) error {
	if r.item == nil {
		return nil
	}
	if n := s.itemMax.Load(); n > 0 && int64(len(r.item.Value)) > n {
		return &valueTooLargeError{key: r.key, size: len(r.item.Value), limit: n, addr: s.addr.str, kept: r.kind.keepsOnRefusal()}
	}
	return nil
}
