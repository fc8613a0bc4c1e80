package meta

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// Limits of the reply parser.
const (
	// MaxLineLen bounds a reply's first line, \r\n included. Real lines
	// are short: a status, a size and a few flags, a key of at most 250
	// bytes and an opaque of at most 32.
	MaxLineLen = 8 << 10

	// DefaultMaxValueSize is memcached's default item size limit (-I 1m)
	// plus room for the item header: the bound on a value read unless the
	// caller sets another (see Options.MaxValueSize).
	DefaultMaxValueSize = 1<<20 + 512

	// MaxItemSize is the largest item memcached stores at all (-I 1024m).
	// A value claimed larger than this is a protocol error, whatever the
	// bound; a bound above it is lowered to it.
	MaxItemSize = 1 << 30

	// growFrom is the size from which a value is read into an array that
	// grows with the bytes that come (see readValue).
	growFrom = 1 << 20
)

// Status is a reply's status code.
type Status uint8

// The status codes of meta replies.
const (
	StatusNone Status = iota
	StatusHD          // HD: success, no value
	StatusVA          // VA <size>: success, a value follows
	StatusEN          // EN: miss (mg)
	StatusNF          // NF: not found (md, ma, ms with C)
	StatusNS          // NS: not stored (ms, ma)
	StatusEX          // EX: CAS mismatch
	StatusMN          // MN: end of a batch (the reply to mn)
)

var statusNames = [...]string{"none", "HD", "VA", "EN", "NF", "NS", "EX", "MN"}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return "Status(" + strconv.Itoa(int(s)) + ")"
}

// Returned is the set of return flags a reply carried.
type Returned uint16

// The return flags, as bits of Returned.
const (
	RetTTL        Returned = 1 << iota // t
	RetFlags                           // f
	RetCAS                             // c
	RetSize                            // s
	RetKey                             // k
	RetOpaque                          // O
	RetWon                             // W
	RetStale                           // X
	RetAlreadyWon                      // Z
)

// Reply is one parsed meta reply. Its fields are meaningful when the
// matching bit of Has is set.
type Reply struct {
	Status      Status
	Has         Returned
	Value       []byte // VA's value (empty otherwise); reused by ReadReply (see there)
	TTL         int64  // t: seconds remaining, -1 if the item never expires
	ClientFlags uint32 // f
	CAS         uint64 // c
	Size        int64  // s
	Key         []byte // k; reused by ReadReply
	Opaque      uint32 // O; opaques are numeric here (those this package sends)
}

// Won reports the W flag: this caller won the right to recache the item.
func (r *Reply) Won() bool { return r.Has&RetWon != 0 }

// Stale reports the X flag: the item was invalidated (md I).
func (r *Reply) Stale() bool { return r.Has&RetStale != 0 }

// AlreadyWon reports the Z flag: another caller already won the recache.
func (r *Reply) AlreadyWon() bool { return r.Has&RetAlreadyWon != 0 }

// ReadReply reads one reply from br into rep, overwriting it. The value of
// a VA reply is read into rep.Value's array if its capacity suffices, into
// a new array of exactly the value's size otherwise: set rep.Value to nil
// first to keep a previous value. A new array for a value over 1 MiB grows
// as its bytes arrive, so that memory follows the bytes a server sends,
// not the size it claims.
//
// A value larger than maxValue (0 means DefaultMaxValueSize; at most
// MaxItemSize) is read and dropped, nothing allocated for it, and the
// error wraps ErrTooLarge: rep has the reply's status and flags, with no
// value, and the stream stays in step. A size over MaxItemSize, a line
// longer than MaxLineLen or br's buffer, or any malformed reply is an
// error wrapping ErrProtocol.
//
// The server's error answers are returned as errors: [*ServerError],
// [*ClientError], [ErrUnknownCommand]; the stream stays in step after them.
// After any other error the stream is out of step and must be dropped.
func ReadReply(br *bufio.Reader, rep *Reply, maxValue int) error {
	if maxValue <= 0 {
		maxValue = DefaultMaxValueSize
	}
	maxValue = min(maxValue, MaxItemSize)
	line, err := br.ReadSlice('\n')
	switch {
	case err == bufio.ErrBufferFull:
		return fmt.Errorf("%w: reply line longer than %d bytes", ErrProtocol, br.Size())
	case err == io.EOF && len(line) > 0:
		return fmt.Errorf("%w: reply line %q cut short: %w", ErrProtocol, trunc(line), io.ErrUnexpectedEOF)
	case err != nil:
		return err
	case len(line) > MaxLineLen:
		return fmt.Errorf("%w: reply line longer than %d bytes", ErrProtocol, MaxLineLen)
	case len(line) < 2 || line[len(line)-2] != '\r':
		return fmt.Errorf("%w: reply line %q not ended by \\r\\n", ErrProtocol, trunc(line))
	}
	line = line[:len(line)-2]
	value := rep.Value[:0]
	*rep = Reply{Value: value, Key: rep.Key[:0]}

	var status, rest []byte
	if i := bytes.IndexByte(line, ' '); i >= 0 {
		status, rest = line[:i], line[i+1:]
	} else {
		status = line
	}
	if len(status) != 2 {
		return errorReply(line)
	}
	switch string(status) {
	case "HD":
		rep.Status = StatusHD
	case "VA":
		rep.Status = StatusVA
	case "EN":
		rep.Status = StatusEN
	case "NF":
		rep.Status = StatusNF
	case "NS":
		rep.Status = StatusNS
	case "EX":
		rep.Status = StatusEX
	case "MN":
		rep.Status = StatusMN
	default:
		return fmt.Errorf("%w: unknown reply status %q", ErrProtocol, trunc(line))
	}

	size := -1
	if rep.Status == StatusVA {
		tok, more := nextToken(rest)
		rest = more
		n, ok := parseUint(tok, 1<<63-1)
		if !ok {
			return fmt.Errorf("%w: garbled value size %q in %q", ErrProtocol, trunc(tok), trunc(line))
		}
		if n > MaxItemSize {
			return fmt.Errorf("%w: value of %d bytes exceeds memcached's largest item size, %d", ErrProtocol, n, MaxItemSize)
		}
		size = int(n)
	}
	for len(rest) > 0 {
		var tok []byte
		tok, rest = nextToken(rest)
		if len(tok) == 0 {
			continue
		}
		if err := rep.parseFlag(tok); err != nil {
			return fmt.Errorf("%w in %q", err, trunc(line))
		}
	}
	if size < 0 {
		return nil
	}

	// line points into br's buffer; it is not used past here.
	tooLarge := size > maxValue
	if tooLarge {
		_, err = br.Discard(size)
	} else {
		value, err = readValue(br, value, size)
	}
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("%w: reading a value of %d bytes: %w", ErrProtocol, size, err)
	}
	cr, err1 := br.ReadByte()
	lf, err2 := br.ReadByte()
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("%w: reading the \\r\\n after a value of %d bytes: %w", ErrProtocol, size, io.ErrUnexpectedEOF)
	}
	if cr != '\r' || lf != '\n' {
		return fmt.Errorf("%w: value of %d bytes not followed by \\r\\n (got %q)", ErrProtocol, size, []byte{cr, lf})
	}
	if tooLarge {
		return fmt.Errorf("%w: a value of %d bytes, over the bound of %d", ErrTooLarge, size, maxValue)
	}
	rep.Value = value
	return nil
}

// readValue reads a value of size bytes from br into value's array if its
// capacity suffices, else into a new array of exactly size bytes. A new
// array over growFrom starts at growFrom and doubles as the bytes arrive:
// a server that claims a large value and sends little costs little. (It
// costs a large value about twice its size in allocations, which its
// transfer dwarfs.)
func readValue(br *bufio.Reader, value []byte, size int) ([]byte, error) {
	if value != nil && cap(value) >= size {
		value = value[:size]
		_, err := io.ReadFull(br, value)
		return value, err
	}
	value = make([]byte, min(size, growFrom))
	for n := 0; ; {
		m, err := io.ReadFull(br, value[n:])
		n += m
		if err != nil || n == size {
			return value, err
		}
		grown := make([]byte, min(2*n, size))
		copy(grown, value)
		value = grown
	}
}

// parseFlag parses one return flag token into rep. Flags this package
// does not know (b, h, l, ...) are skipped.
func (rep *Reply) parseFlag(tok []byte) error {
	arg := tok[1:]
	ok := true
	var v uint64
	switch tok[0] {
	case 't':
		rep.Has |= RetTTL
		if string(arg) == "-1" {
			rep.TTL = -1
		} else {
			v, ok = parseUint(arg, 1<<63-1)
			rep.TTL = int64(v)
		}
	case 'f':
		rep.Has |= RetFlags
		v, ok = parseUint(arg, 1<<32-1)
		rep.ClientFlags = uint32(v)
	case 'c':
		rep.Has |= RetCAS
		rep.CAS, ok = parseUint(arg, 1<<64-1)
	case 's':
		rep.Has |= RetSize
		v, ok = parseUint(arg, 1<<63-1)
		rep.Size = int64(v)
	case 'O':
		rep.Has |= RetOpaque
		v, ok = parseUint(arg, 1<<32-1)
		rep.Opaque = uint32(v)
	case 'k':
		rep.Has |= RetKey
		rep.Key = append(rep.Key[:0], arg...)
	case 'W':
		rep.Has |= RetWon
	case 'X':
		rep.Has |= RetStale
	case 'Z':
		rep.Has |= RetAlreadyWon
	}
	if !ok {
		return fmt.Errorf("%w: garbled number in return flag %q", ErrProtocol, trunc(tok))
	}
	return nil
}

// errorReply parses a line whose status is not two letters: the server's
// error answers, or garbage.
func errorReply(line []byte) error {
	switch {
	case string(line) == "ERROR":
		return ErrUnknownCommand
	case bytes.HasPrefix(line, []byte("SERVER_ERROR")):
		return &ServerError{Msg: string(bytes.TrimSpace(line[len("SERVER_ERROR"):]))}
	case bytes.HasPrefix(line, []byte("CLIENT_ERROR")):
		return &ClientError{Msg: string(bytes.TrimSpace(line[len("CLIENT_ERROR"):]))}
	}
	return fmt.Errorf("%w: unknown reply status %q", ErrProtocol, trunc(line))
}

// parseUint parses a decimal number of at most max, with no sign, without
// allocating.
func parseUint(b []byte, max uint64) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if n > (max-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

func nextToken(b []byte) (tok, rest []byte) {
	if i := bytes.IndexByte(b, ' '); i >= 0 {
		return b[:i], b[i+1:]
	}
	return b, nil
}

// trunc bounds what an error quotes of a reply.
func trunc(b []byte) []byte {
	if len(b) > 64 {
		return b[:64]
	}
	return b
}
