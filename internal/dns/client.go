package dns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"time"
)

// This file sends queries: over UDP, again over TCP when the answer is
// truncated, within a timeout per try.

// The errors of a lookup, wrapped in an *Error; test them with errors.Is.
var (
	ErrNotFound      = errors.New("no such name (NXDOMAIN)")
	ErrServerFailure = errors.New("the DNS server failed to answer (SERVFAIL)")
	ErrRefused       = errors.New("the DNS server refused the query (REFUSED)")
	ErrTimeout       = errors.New("no answer from the DNS server in time")
)

// Error is a failed lookup: what was asked, of which server, and why.
type Error struct {
	Name   string // the name asked, as given
	Type   Type
	Server string
	Tried  []string // the names asked, after the search list, when more than Name
	Err    error
}

func (e *Error) Error() string {
	s := fmt.Sprintf("lookup %s %s at %s", e.Type, e.Name, e.Server)
	if len(e.Tried) > 1 {
		s += fmt.Sprintf(" (as %q)", e.Tried)
	}
	return s + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// DefaultTimeout is the time a Client waits for each answer.
const DefaultTimeout = 2 * time.Second

// Client sends queries to one server. Its zero value is not usable: set
// Server. It is safe for concurrent use; it keeps no connections.
type Client struct {
	// Server is the server's host:port, such as "10.96.0.10:53".
	Server string
	// Timeout is how long each try waits for its answer; 0 means
	// DefaultTimeout.
	Timeout time.Duration
	// Tries is how many times a query is sent over UDP before it times
	// out; 0 means 2, as resolv.conf's attempts.
	Tries int
	// Search and Ndots are resolv.conf's: a name with fewer than Ndots dots
	// is tried with each suffix of Search first (see Lookup).
	Search []string
	Ndots  int
}

// Exchange sends one query for name and t and returns the server's
// answer, which has its ID and question. An answer with the TC bit set is
// asked again over TCP. It returns an error for a network failure, a
// timeout (wrapping ErrTimeout) or a malformed answer; the answer's RCode
// is the caller's to read.
func (c *Client) Exchange(ctx context.Context, name string, t Type) (Message, error) {
	id := uint16(rand.Uint32())
	q, err := Query(id, name, t)
	if err != nil {
		return Message{}, err
	}
	m, err := c.udp(ctx, q, name, t)
	if err == nil && m.Truncated {
		m, err = c.tcp(ctx, q, name, t)
	}
	return m, err
}

func (c *Client) timeout() time.Duration {
	if c.Timeout > 0 {
		return c.Timeout
	}
	return DefaultTimeout
}

// udp sends q over UDP, again after each try's timeout, and returns the
// first answer to it. Datagrams that are not its answer (another ID or
// question, a malformed one) are dropped, as a late answer to an earlier
// query or a spoofed one would be; they cannot keep it past its deadline.
func (c *Client) udp(ctx context.Context, q []byte, name string, t Type) (Message, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "udp", c.Server)
	if err != nil {
		return Message{}, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()

	buf := make([]byte, MaxMessage)
	tries := c.Tries
	if tries <= 0 {
		tries = 2
	}
	var bad error // the last datagram dropped, for the timeout's message
	for range tries {
		if _, err := conn.Write(q); err != nil {
			return Message{}, err
		}
		deadline := time.Now().Add(c.timeout())
		if err := conn.SetReadDeadline(deadline); err != nil {
			return Message{}, err
		}
		for {
			n, err := conn.Read(buf)
			if ctx.Err() != nil {
				return Message{}, ctx.Err()
			}
			if isTimeout(err) {
				break
			}
			if err != nil {
				return Message{}, err
			}
			m, err := Parse(buf[:n])
			if err == nil {
				err = matches(m, q, name, t)
			}
			if err == nil {
				return m, nil
			}
			bad = err
		}
	}
	if bad != nil {
		return Message{}, fmt.Errorf("%w (%d tries of %v; the last datagram dropped: %w)", ErrTimeout, tries, c.timeout(), bad)
	}
	return Message{}, fmt.Errorf("%w (%d tries of %v)", ErrTimeout, tries, c.timeout())
}

// tcp sends q over TCP and returns the answer, which is framed by its
// two-byte length and so at most MaxMessage bytes.
func (c *Client) tcp(ctx context.Context, q []byte, name string, t Type) (Message, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout())
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", c.Server)
	if err != nil {
		return Message{}, fmt.Errorf("the UDP answer was truncated, and TCP failed: %w", timeoutOf(err))
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()

	framed := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(q)), uint16(len(q)))
	if _, err := conn.Write(append(framed, q...)); err != nil {
		return Message{}, fmt.Errorf("the UDP answer was truncated, and TCP failed: %w", timeoutOf(err))
	}
	var l [2]byte
	if _, err := io.ReadFull(conn, l[:]); err != nil {
		return Message{}, fmt.Errorf("the UDP answer was truncated, and TCP failed: %w", timeoutOf(err))
	}
	buf := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(conn, buf); err != nil {
		return Message{}, fmt.Errorf("the UDP answer was truncated, and TCP failed: %w", timeoutOf(err))
	}
	m, err := Parse(buf)
	if err == nil {
		err = matches(m, q, name, t)
	}
	if err != nil {
		return Message{}, fmt.Errorf("over TCP: %w", err)
	}
	return m, nil
}

// matches reports whether m is the answer to q, a query for name and t.
func matches(m Message, q []byte, name string, t Type) error {
	switch {
	case m.ID != u16(q, 0):
		return fmt.Errorf("an answer with ID %d, not the query's %d", m.ID, u16(q, 0))
	case !m.Response:
		return errors.New("a query, not an answer")
	case m.RCode != RCodeFormErr && (m.Question.Type != t || !EqualNames(m.Question.Name, name)):
		// A server that cannot parse the query may not echo it.
		return fmt.Errorf("an answer to %s %s, not to %s %s", m.Question.Type, m.Question.Name, t, name)
	}
	return nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// timeoutOf returns err, as ErrTimeout if it is a timeout.
func timeoutOf(err error) error {
	if isTimeout(err) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	}
	return err
}
