package selector

import (
	"errors"
	"strings"

	"github.com/kubecache/k8s-memcache-selector/internal/meta"
)

// answered reports whether err is the server's answer to a request it
// understood and did not carry out, so that the value it holds is as
// before: a CLIENT_ERROR (an Increment of a value that is not a number),
// or a SERVER_ERROR that says the value was not stored (too large for the
// server, or out of memory). Such a write did not fail in the way a
// timeout or a broken connection does, whose outcome is unknown: nothing
// needs deleting after it, and gomemcache, which deletes nothing, keeps the
// value. Any other SERVER_ERROR (a proxy's, for a request to its backend
// that timed out) may have landed, and is a failed write.
//
// A value the Client did not send, as larger than the server stores (see
// valueTooLargeError), is such an answer, but for a set: memcached deletes
// the key's old value when it refuses a set, so that the old value is not
// served after it, and here the Client's cleanup of a failed write deletes
// it (see afterWrite).
func answered(err error) bool {
	var ce *meta.ClientError
	var tl *valueTooLargeError
	if errors.As(err, &tl) {
		return tl.kept
	}
	return errors.As(err, &ce) || strings.HasPrefix(err.Error(), "memcache: client error: ") || refusedStore(err)
}

// refusedStore reports whether err is a SERVER_ERROR that says the value
// was not stored, in either protocol's wording (the classic one's, as
// gomemcache words it, has no error type), or a value the Client did not
// send, as larger than the server stores.
func refusedStore(err error) bool {
	var se *meta.ServerError
	var tl *valueTooLargeError
	if errors.As(err, &tl) {
		return true
	}
	if errors.As(err, &se) {
		return notStored(se.Msg)
	}
	msg := err.Error()
	_, reply, ok := strings.Cut(msg, `"SERVER_ERROR `)
	return ok && strings.HasPrefix(msg, "memcache: unexpected response line from ") && notStored(reply)
}

// notStored reports whether msg, a SERVER_ERROR's text, says that
// memcached did not store the value.
func notStored(msg string) bool {
	return strings.HasPrefix(msg, "object too large") || strings.HasPrefix(msg, "out of memory")
}
