package discovery

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
)

// This file decodes what the API server sends, LIST bodies and WATCH
// streams, within bounds on bytes and items.

// Bounds on what the API server may send, so that a broken or hostile one
// cannot exhaust memory. etcd keeps objects of at most 1.5 MiB; one
// Service's EndpointSlices list in kilobytes to a few megabytes, and a ring
// takes at most maxMembers servers. A list is bounded in items too, since a
// tiny item such as 0 costs more in memory than in JSON.
const (
	maxListBytes  = 64 << 20
	maxListItems  = 100_000
	maxEventBytes = 8 << 20 // a watch event, and each value in a list
)

// errTooLarge is a response over one of the bounds above.
var errTooLarge = errors.New("too large")

// limitReader reads from r until max bytes have been read since the count
// was last set, then fails with errTooLarge.
type limitReader struct {
	r           io.Reader
	n, max      int
	what        string // for the error: "a watch event"
	tooLargeFor string // "a Kubernetes object"
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n >= l.max {
		return 0, l.err()
	}
	p = p[:min(len(p), l.max-l.n)]
	n, err := l.r.Read(p)
	l.n += n
	return n, err
}

func (l *limitReader) err() error {
	return fmt.Errorf("%s is over %d MiB, %w for %s: is the API server URL (WithAPIServer) a Kubernetes API server's?", l.what, l.max>>20, errTooLarge, l.tooLargeFor)
}

// list GETs a collection and decodes it into l. (The transport inflates
// gzip first, so the bounds are on the inflated size.)
func (c *client) list(ctx context.Context, path string, q url.Values, r request, l *objectList) error {
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	resp, err := c.get(ctx, path, q, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	all := &limitReader{r: resp.Body, max: maxListBytes, what: "the " + r.resource + " list", tooLargeFor: "the list of one Service"}
	if resp.ContentLength > maxListBytes {
		err = all.err() // said so at once: no need to read it
	} else {
		err = decodeList(all, l)
	}
	if err != nil {
		return fmt.Errorf("decode %s list: %w", r.resource, err)
	}
	return nil
}

// decodeList decodes a list from r into l, one value at a time: decoding
// the list as one value would take twice its size in buffers, and up to 80
// times its size for tiny items. Each value is at most maxEventBytes, and
// the items at most maxListItems. Only the fields of objectList are read.
func decodeList(r io.Reader, l *objectList) error {
	d := &listDecoder{one: &limitReader{r: r, max: maxEventBytes, what: "a value in the list", tooLargeFor: "a Kubernetes object"}}
	d.dec = json.NewDecoder(d.one)
	if err := d.delim('{'); err != nil {
		return err
	}
	for d.dec.More() {
		key, err := d.token()
		if err != nil {
			return err
		}
		switch key {
		case "kind":
			err = d.value(&l.Kind)
		case "metadata":
			err = d.value(&l.Metadata)
		case "items":
			err = d.items(l)
		default:
			var skip json.RawMessage
			err = d.value(&skip)
		}
		if err != nil {
			return err
		}
	}
	return d.delim('}')
}

// listDecoder reads a list's JSON, bounding each value it decodes.
type listDecoder struct {
	dec *json.Decoder
	one *limitReader // reads dec's input, and counts the current value's bytes
}

func (d *listDecoder) value(v any) error {
	err := d.dec.Decode(v)
	d.one.n = buffered(d.dec) // what is read ahead belongs to the next value
	return err
}

func (d *listDecoder) token() (json.Token, error) {
	t, err := d.dec.Token()
	d.one.n = buffered(d.dec)
	return t, err
}

// delim reads the delimiter want.
func (d *listDecoder) delim(want json.Delim) error {
	t, err := d.token()
	if err == nil && t != want {
		err = fmt.Errorf("found %v where the list has %v", t, want)
	}
	return err
}

// items decodes the items array of l, or null.
func (d *listDecoder) items(l *objectList) error {
	l.Items = nil // a repeated key replaces the items, as in encoding/json
	t, err := d.token()
	if err != nil || t == nil {
		return err
	}
	if t != json.Delim('[') {
		return fmt.Errorf("found %v where the list has its items array", t)
	}
	for d.dec.More() {
		if len(l.Items) == maxListItems {
			return fmt.Errorf("the list has over %d items, %w for the list of one Service: is the API server URL (WithAPIServer) a Kubernetes API server's?", maxListItems, errTooLarge)
		}
		var item json.RawMessage
		if err := d.value(&item); err != nil {
			return err
		}
		l.Items = append(l.Items, item)
	}
	return d.delim(']')
}

// buffered returns how many bytes dec has read ahead of what it decoded.
func buffered(dec *json.Decoder) int {
	if r, ok := dec.Buffered().(interface{ Len() int }); ok { // a *bytes.Reader: no copy
		return r.Len()
	}
	n, _ := io.Copy(io.Discard, dec.Buffered())
	return int(n)
}

// event is one watch event; object is decoded by type.
type event struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// watchStream reads the events of one WATCH response, each of at most
// maxEventBytes.
type watchStream struct {
	body  io.ReadCloser
	limit *limitReader
	buf   *bufio.Reader
	dec   *json.Decoder
}

// watch starts a WATCH (a GET with watch=1) and returns its event stream once
// the server has answered 200. ctx bounds the whole stream.
func (c *client) watch(ctx context.Context, path string, q url.Values, r request) (*watchStream, error) {
	q.Set("watch", "1")
	resp, err := c.get(ctx, path, q, r)
	if err != nil {
		return nil, err
	}
	return newWatchStream(resp.Body), nil
}

func newWatchStream(body io.ReadCloser) *watchStream {
	s := &watchStream{body: body, limit: &limitReader{r: body, max: maxEventBytes, what: "a watch event", tooLargeFor: "a Kubernetes object"}}
	// A large buffer takes in a burst of events with one read, so that more
	// can tell that they arrived together.
	s.buf = bufio.NewReaderSize(s.limit, 64<<10)
	s.dec = json.NewDecoder(s.buf)
	return s
}

// next returns the next event. A closed connection, a server timeout and the
// end of ctx all end the stream with io.EOF: the caller resumes from the last
// resource version. Malformed JSON and an event over maxEventBytes are
// errors.
func (s *watchStream) next() (event, error) {
	var ev event
	err := s.dec.Decode(&ev)
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case err == nil:
		// What is read ahead belongs to the next event.
		s.limit.n = s.buf.Buffered() + buffered(s.dec)
		return ev, nil
	case errors.As(err, &syntax), errors.As(err, &typ), errors.Is(err, errTooLarge):
		return ev, fmt.Errorf("decode watch event: %w", err)
	default:
		return ev, io.EOF
	}
}

// more reports whether the next event has already arrived, at least in
// part: bytes other than the newlines between events are waiting. It reads
// only up to the first such byte, since the decoder may hold megabytes.
func (s *watchStream) more() bool {
	if s.buf.Buffered() > 0 {
		return true
	}
	r := s.dec.Buffered() // a view: reading it leaves the decoder's bytes in place
	var b [1]byte
	for {
		if n, _ := r.Read(b[:]); n == 0 {
			return false
		}
		switch b[0] {
		case ' ', '\t', '\r', '\n':
		default:
			return true
		}
	}
}

func (s *watchStream) close() { s.body.Close() }

// The API objects, with only the fields the ServerList reads.

type objectMeta struct {
	Name            string `json:"name"`
	ResourceVersion string `json:"resourceVersion"`
	Annotations     struct {
		// When the controller saw the change that this version of the
		// object reflects (RFC 3339), for RingEvent.Lag.
		Trigger string `json:"endpoints.kubernetes.io/last-change-trigger-time"`
	} `json:"annotations"`
}

type listMeta struct {
	ResourceVersion string `json:"resourceVersion"`
}

// objectList is a list, as decodeList reads it: only these fields.
type objectList struct {
	Kind     string            `json:"kind"`
	Metadata listMeta          `json:"metadata"`
	Items    []json.RawMessage `json:"items"`
}
