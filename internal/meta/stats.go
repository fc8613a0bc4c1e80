package meta

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
)

// maxStatLines bounds a stats reply: memcached 1.6 sends about 80 lines
// of settings.
const maxStatLines = 1024

// ErrNoSetting: the server's stats settings did not say what was asked.
var ErrNoSetting = errors.New("meta: setting not in the server's stats settings")

// ItemSizeMax asks the server for the largest item it stores, its
// item_size_max (memcached's -I; header included, so every value it sends
// is smaller), with the classic command stats settings, which memcached
// answers on a meta connection too. A server that does not know the
// command answers an error ([ErrUnknownCommand]), and one that does not
// say [ErrNoSetting]; the connection stays usable after either.
func (c *Conn) ItemSizeMax(ctx context.Context) (int, error) {
	cl := getCall(opStats, "")
	if err := c.do(ctx, cl); err != nil {
		return 0, err
	}
	defer putCall(cl)
	if cl.err != nil {
		return 0, cl.err
	}
	return int(cl.rep.Size), nil
}

// readStats reads the reply to stats settings into cl: item_size_max
// into cl.rep.Size, or an answer into cl.err. An error after which the
// stream cannot be trusted is returned.
func (c *Conn) readStats(cl *call) error {
	n, err := readStat(c.br, "item_size_max")
	switch {
	case err == nil:
		cl.rep.Size = n
	case errors.Is(err, ErrNoSetting), errors.Is(err, ErrUnknownCommand), isServerError(err), isClientError(err):
		cl.err = err // the reply has ended: in step
	default:
		return c.readError(err)
	}
	return nil
}

// readStat reads a stats reply (STAT lines, then END) from br and returns
// the value of the stat name, a number (which the caller bounds). The
// reply is read to its end: at most maxStatLines lines, each within br's
// buffer. The server's error answers end the reply too, and are returned
// as ReadReply returns them.
func readStat(br *bufio.Reader, name string) (int64, error) {
	var value int64 = -1
	for range maxStatLines {
		line, err := br.ReadSlice('\n')
		switch {
		case err == bufio.ErrBufferFull:
			return 0, fmt.Errorf("%w: stats line longer than %d bytes", ErrProtocol, br.Size())
		case err == io.EOF && len(line) > 0:
			return 0, fmt.Errorf("%w: stats line %q cut short: %w", ErrProtocol, trunc(line), io.ErrUnexpectedEOF)
		case err != nil:
			return 0, err
		}
		line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
		if string(line) == "END" {
			if value < 0 {
				return 0, fmt.Errorf("%w: %s", ErrNoSetting, name)
			}
			return value, nil
		}
		rest, ok := bytes.CutPrefix(line, []byte("STAT "))
		if !ok {
			if err := errorReply(line); !errors.Is(err, ErrProtocol) {
				return 0, err
			}
			return 0, fmt.Errorf("%w: %q in a stats reply", ErrProtocol, trunc(line))
		}
		if k, v, _ := bytes.Cut(rest, []byte(" ")); string(k) == name {
			n, ok := parseUint(v, 1<<62)
			if !ok {
				return 0, fmt.Errorf("%w: garbled stat %q", ErrProtocol, trunc(line))
			}
			value = int64(n)
		}
	}
	return 0, fmt.Errorf("%w: stats reply of more than %d lines", ErrProtocol, maxStatLines)
}
