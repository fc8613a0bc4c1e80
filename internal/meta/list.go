package meta

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"
)

// Listed is one item of a server's key listing (lru_crawler metadump).
type Listed struct {
	Key  string
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

// List lists every key on the server behind nc with
// "lru_crawler metadump all" and calls f for each, in the server's order,
// until the listing ends, f returns an error (which List returns), or ctx
// ends. nc must be a connection of its own, used for nothing else: the
// listing streams for as long as the server has keys, and a listing
// abandoned midway leaves the stream mid-reply, so List closes nc
// whenever it returns an error. Each read is bounded by timeout (0 means
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
	nc.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := nc.Write([]byte("lru_crawler metadump all\r\n")); err != nil {
		return listError(ctx, fmt.Errorf("meta: listing keys: %w", err))
	}
	br := bufio.NewReaderSize(nc, MaxLineLen)
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
		switch {
		case bytes.Equal(line, []byte("END")):
			return nil
		case n == 0 && bytes.HasPrefix(line, []byte("BUSY")):
			return fmt.Errorf("%w: %s", ErrCrawlerBusy, trunc(line))
		case n == 0 && (bytes.Equal(line, []byte("ERROR")) || bytes.HasPrefix(line, []byte("CLIENT_ERROR")) ||
			bytes.HasPrefix(line, []byte("SERVER_ERROR"))):
			return fmt.Errorf("%w: it answered %q", ErrNoListing, trunc(line))
		}
		it, err := ParseListed(line)
		if err != nil {
			return err
		}
		if err := f(it); err != nil {
			return err
		}
	}
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
// cas=<cas> fetch=<yes|no> cls=<slab class> size=<bytes>". Fields it does
// not know are skipped, so that a later memcached may add some; key and
// exp are required.
func ParseListed(line []byte) (Listed, error) {
	var it Listed
	var haveKey, haveExp bool
	for len(line) > 0 {
		var field []byte
		field, line, _ = bytes.Cut(line, []byte(" "))
		name, val, ok := bytes.Cut(field, []byte("="))
		if !ok {
			return Listed{}, fmt.Errorf("%w: listing field %q without a value", ErrProtocol, trunc(field))
		}
		var err error
		switch string(name) {
		case "key":
			var k string
			k, err = url.PathUnescape(string(val))
			if err == nil && CheckKey(k) != nil {
				err = errors.New("not a key memcached accepts")
			}
			it.Key, haveKey = k, true
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
