package meta

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"
)

// Listed is one item of a server's key listing (lru_crawler mgdump or
// metadump).
type Listed struct {
	Key string
	// Invalid: Key is not one CheckKey accepts (a space, a control byte, too
	// long): another client's, written through the binary protocol or the
	// meta protocol's base64 keys. No request of this package can name it.
	Invalid bool
	// From metadump only (memcached before 1.6.19); zero from mgdump.
	Exp  int64 // when it expires, in unix seconds by the server's clock; -1: never
	CAS  uint64
	Size int64 // the item's size in memory, header included
}

// ErrCrawlerBusy: the server's LRU crawler is busy with another request
// (memcached runs one crawl at a time); list again later.
var ErrCrawlerBusy = errors.New("meta: lru_crawler busy with another request")

// ErrNoListing: the server refused to list its keys: its LRU crawler is
// disabled (memcached -o no_lru_crawler) or it does not have one (a
// proxy, memcached before 1.4.31). Keys cannot be moved from it.
var ErrNoListing = errors.New("meta: server cannot list its keys (lru_crawler metadump refused)")

// The two listings. mgdump (memcached 1.6.19 and later) lists keys alone,
// a third of metadump's bytes, and names binary keys in base64; metadump
// is what older servers have. memcached 1.6.43 and later open either
// reply with an OK line; their lines may end in a bare newline, and
// metadump's carry fields older servers do not have (flags=).
var (
	mgdump   = dump{cmd: "lru_crawler mgdump all\r\n", end: "EN", parse: parseMgdump}
	metadump = dump{cmd: "lru_crawler metadump all\r\n", end: "END", parse: ParseListed}
)

type dump struct {
	cmd, end string
	parse    func([]byte) (Listed, error)
}

// List lists every key on the server behind nc and calls f for each, in
// the server's order, until the listing ends, f returns an error (which
// List returns), or ctx ends. It asks for mgdump, and for metadump where
// the server does not know mgdump. A key no request can name is listed
// with Invalid set, never an error: one key another client wrote must not
// stop the listing.
//
// nc must be a connection of its own, used for nothing else: the listing
// streams for as long as the server has keys, and a listing abandoned
// midway leaves the stream mid-reply, so List closes nc whenever it
// returns an error. Each read is bounded by timeout (0 means
// DefaultTimeout) and each line by MaxLineLen.
//
// A listing is a snapshot taken while the server serves: memcached lists
// what its crawler finds, which can miss items written just before (see
// memcached's doc/protocol.txt) and include items that were deleted or
// expired since. Callers confirm each item with mg before acting on it.
func List(ctx context.Context, nc net.Conn, timeout time.Duration, f func(Listed) error) (err error) {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	defer func() {
		if err != nil {
			nc.Close()
		}
	}()
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	br := bufio.NewReaderSize(nc, MaxLineLen)
	d := mgdump
	if err := listSend(ctx, nc, timeout, d); err != nil {
		return err
	}
	for n := 0; ; n++ {
		nc.SetReadDeadline(time.Now().Add(timeout))
		line, err := br.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			return fmt.Errorf("%w: a listing line longer than %d bytes", ErrProtocol, MaxLineLen)
		case err != nil:
			return listError(ctx, fmt.Errorf("meta: listing keys, after %d: %w", n, err))
		}
		line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
		refusal := bytes.Equal(line, []byte("ERROR")) || bytes.HasPrefix(line, []byte("CLIENT_ERROR")) ||
			bytes.HasPrefix(line, []byte("SERVER_ERROR"))
		switch {
		case string(line) == d.end:
			return nil
		case n == 0 && bytes.Equal(line, []byte("OK")):
			n = -1 // what follows is the listing's first line
			continue
		case n == 0 && bytes.HasPrefix(line, []byte("BUSY")):
			return fmt.Errorf("%w: %s", ErrCrawlerBusy, trunc(line))
		case n == 0 && refusal && d.end == mgdump.end: // before 1.6.19, or mgdump refused: try metadump
			d, n = metadump, -1
			if err := listSend(ctx, nc, timeout, d); err != nil {
				return err
			}
			continue
		case n == 0 && refusal:
			return fmt.Errorf("%w: it answered %q", ErrNoListing, trunc(line))
		}
		it, err := d.parse(line)
		if err != nil {
			return err
		}
		if err := f(it); err != nil {
			return err
		}
	}
}

// listSend sends d's request.
func listSend(ctx context.Context, nc net.Conn, timeout time.Duration, d dump) error {
	nc.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := nc.Write([]byte(d.cmd)); err != nil {
		return listError(ctx, fmt.Errorf("meta: listing keys: %w", err))
	}
	return nil
}

// listError is err, or ctx's error if ctx ended: its deadline was moved
// to stop the listing.
func listError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("meta: listing keys: %w", ctx.Err())
	}
	return err
}

// ParseListed parses one line of lru_crawler metadump (without its line
// end): "key=<URI-encoded key> exp=<unix time or -1> la=<last access>
// cas=<cas> fetch=<yes|no> cls=<slab class> size=<bytes>", and from
// memcached 1.6.43 " flags=<flags> " with a trailing space. Fields it does
// not know are skipped, so that a later memcached may add some; key and
// exp are required.
func ParseListed(line []byte) (Listed, error) {
	var it Listed
	var haveKey, haveExp bool
	for len(line) > 0 {
		var field []byte
		field, line, _ = bytes.Cut(line, []byte(" "))
		if len(field) == 0 {
			continue
		}
		name, val, ok := bytes.Cut(field, []byte("="))
		if !ok {
			return Listed{}, fmt.Errorf("%w: listing field %q without a value", ErrProtocol, trunc(field))
		}
		var err error
		switch string(name) {
		case "key":
			it.Key, err = url.PathUnescape(string(val))
			it.Invalid, haveKey = err == nil && CheckKey(it.Key) != nil, true
		case "exp":
			it.Exp, err = strconv.ParseInt(string(val), 10, 64)
			if err == nil && it.Exp < -1 {
				err = errors.New("below -1")
			}
			haveExp = true
		case "cas":
			it.CAS, err = strconv.ParseUint(string(val), 10, 64)
		case "size":
			it.Size, err = strconv.ParseInt(string(val), 10, 64)
		}
		if err != nil {
			return Listed{}, fmt.Errorf("%w: listing field %s=%q: %v", ErrProtocol, name, trunc(val), err)
		}
	}
	if !haveKey || !haveExp {
		return Listed{}, fmt.Errorf("%w: a listing line without key= and exp=", ErrProtocol)
	}
	return it, nil
}

// parseMgdump parses one line of lru_crawler mgdump (without its line
// end): "mg <key>", or "mg <base64 of the key> b" for a key the text
// protocol cannot name. Other flags are skipped.
func parseMgdump(line []byte) (Listed, error) {
	rest, ok := bytes.CutPrefix(line, []byte("mg "))
	if !ok {
		return Listed{}, fmt.Errorf("%w: a listing line %q that is not mg <key>", ErrProtocol, trunc(line))
	}
	fields := bytes.Fields(rest)
	if len(fields) == 0 {
		return Listed{}, fmt.Errorf("%w: a listing line %q without a key", ErrProtocol, trunc(line))
	}
	key := string(fields[0])
	for _, fl := range fields[1:] {
		if string(fl) != "b" {
			continue
		}
		b, err := base64.StdEncoding.DecodeString(key)
		if err != nil {
			return Listed{}, fmt.Errorf("%w: a listing line's base64 key %q: %v", ErrProtocol, trunc(fields[0]), err)
		}
		key = string(b)
	}
	return Listed{Key: key, Invalid: CheckKey(key) != nil}, nil
}
