// Package dnstest is a DNS server for tests: it listens on 127.0.0.1, UDP
// and TCP on one port, and answers each query with what a handler says, in
// the real wire format, names compressed. It can change its answers, drop
// queries (a timeout), answer NXDOMAIN or SERVFAIL, truncate, and send any
// bytes at all.
package dnstest

import (
	"encoding/binary"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kubecache/k8s-memcache-selector/internal/dns"
)

// Reply is a handler's answer to a query.
type Reply struct {
	RCode      int
	Answers    []dns.Record
	Additional []dns.Record
	// Truncate sends, over UDP, an empty answer with the TC bit set, so
	// that the client asks again over TCP.
	Truncate bool
	// Drop sends nothing: the client times out.
	Drop bool
	// Delay waits before answering.
	Delay time.Duration
	// Raw, if set, is sent instead, with the query's ID written into its
	// first two bytes when it has them.
	Raw []byte
}

// Handler answers a query; tcp says whether it came over TCP.
type Handler func(q dns.Question, tcp bool) Reply

// Server is a running test server.
type Server struct {
	udp  net.PacketConn
	tcp  net.Listener
	wg   sync.WaitGroup
	h    atomic.Pointer[Handler]
	UDP  atomic.Int64 // queries received over UDP
	TCP  atomic.Int64 // queries received over TCP
	once sync.Once
}

// New starts a server answering with h, closed when t ends.
func New(t testing.TB, h Handler) *Server {
	t.Helper()
	s, err := Start(h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Start starts a server answering with h; Close stops it.
func Start(h Handler) (*Server, error) {
	s := &Server{}
	s.Set(h)
	for i := 0; ; i++ {
		u, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		l, err := net.Listen("tcp", u.LocalAddr().String())
		if err == nil {
			s.udp, s.tcp = u, l
			break
		}
		u.Close()
		if i == 20 {
			return nil, err
		}
	}
	s.wg.Add(2)
	go s.serveUDP()
	go s.serveTCP()
	return s, nil
}

// Addr is the server's address, for both UDP and TCP.
func (s *Server) Addr() string { return s.udp.LocalAddr().String() }

// Set makes h the handler from now on.
func (s *Server) Set(h Handler) { s.h.Store(&h) }

// Close stops the server and waits for its goroutines.
func (s *Server) Close() {
	s.once.Do(func() {
		s.udp.Close()
		s.tcp.Close()
		s.wg.Wait()
	})
}

func (s *Server) serveUDP() {
	defer s.wg.Done()
	buf := make([]byte, dns.MaxMessage)
	for {
		n, from, err := s.udp.ReadFrom(buf)
		if err != nil {
			return
		}
		s.UDP.Add(1)
		q := append([]byte(nil), buf[:n]...)
		s.wg.Go(func() {
			if out := s.answer(q, false); out != nil {
				s.udp.WriteTo(out, from)
			}
		})
	}
}

func (s *Server) serveTCP() {
	defer s.wg.Done()
	for {
		c, err := s.tcp.Accept()
		if err != nil {
			return
		}
		s.wg.Go(func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			var l [2]byte
			if _, err := io.ReadFull(c, l[:]); err != nil {
				return
			}
			q := make([]byte, binary.BigEndian.Uint16(l[:]))
			if _, err := io.ReadFull(c, q); err != nil {
				return
			}
			s.TCP.Add(1)
			if out := s.answer(q, true); out != nil {
				c.Write(binary.BigEndian.AppendUint16(nil, uint16(len(out))))
				c.Write(out)
			} else {
				io.Copy(io.Discard, c) // hold the connection until the client gives up
			}
		})
	}
}

// answer returns the bytes to send for query q, or nil for none.
func (s *Server) answer(q []byte, tcp bool) []byte {
	m, err := dns.Parse(q)
	if err != nil || m.Question.Name == "" && m.Question.Type == 0 {
		return nil
	}
	r := (*s.h.Load())(m.Question, tcp)
	if r.Delay > 0 {
		time.Sleep(r.Delay)
	}
	switch {
	case r.Drop:
		return nil
	case r.Raw != nil:
		out := append([]byte(nil), r.Raw...)
		if len(out) >= 2 {
			out[0], out[1] = byte(m.ID>>8), byte(m.ID)
		}
		return out
	case r.Truncate && !tcp:
		return Pack(m.ID, m.Question, Reply{RCode: r.RCode}, true)
	}
	return Pack(m.ID, m.Question, r, false)
}

// Pack returns the message answering q with r, names compressed.
func Pack(id uint16, q dns.Question, r Reply, truncated bool) []byte {
	b := make([]byte, 12, 512)
	binary.BigEndian.PutUint16(b, id)
	b[2] = 0x81 // QR, RD
	if truncated {
		b[2] |= 0x02
	}
	b[3] = 0x80 | byte(r.RCode&0x0f) // RA
	binary.BigEndian.PutUint16(b[4:], 1)
	binary.BigEndian.PutUint16(b[6:], uint16(len(r.Answers)))
	binary.BigEndian.PutUint16(b[10:], uint16(len(r.Additional)))
	p := packer{b: b, at: map[string]int{}}
	p.name(q.Name)
	p.b = binary.BigEndian.AppendUint16(p.b, uint16(q.Type))
	p.b = append(p.b, 0, 1)
	for _, rr := range append(append([]dns.Record(nil), r.Answers...), r.Additional...) {
		p.record(rr)
	}
	return p.b
}

type packer struct {
	b  []byte
	at map[string]int // offsets of the names written, by lower-case suffix
}

// name writes n with the longest suffix already written as a pointer. The
// labels of n are written as they are, so that a test can send any bytes.
func (p *packer) name(n string) {
	n = strings.TrimSuffix(n, ".")
	for n != "" {
		if off, ok := p.at[strings.ToLower(n)]; ok {
			p.b = binary.BigEndian.AppendUint16(p.b, 0xc000|uint16(off))
			return
		}
		if len(p.b) < 0x3fff {
			p.at[strings.ToLower(n)] = len(p.b)
		}
		l, rest, _ := strings.Cut(n, ".")
		p.b = append(p.b, byte(len(l)))
		p.b = append(p.b, l...)
		n = rest
	}
	p.b = append(p.b, 0)
}

func (p *packer) record(r dns.Record) {
	p.name(r.Name)
	p.b = binary.BigEndian.AppendUint16(p.b, uint16(r.Type))
	p.b = append(p.b, 0, 1)
	p.b = binary.BigEndian.AppendUint32(p.b, r.TTL)
	at := len(p.b)
	p.b = append(p.b, 0, 0)
	switch r.Type {
	case dns.TypeA, dns.TypeAAAA:
		p.b = append(p.b, r.Addr.AsSlice()...)
	case dns.TypeSRV:
		p.b = binary.BigEndian.AppendUint16(p.b, r.Priority)
		p.b = binary.BigEndian.AppendUint16(p.b, r.Weight)
		p.b = binary.BigEndian.AppendUint16(p.b, r.Port)
		p.name(r.Target)
	case dns.TypeCNAME:
		p.name(r.Target)
	}
	binary.BigEndian.PutUint16(p.b[at:], uint16(len(p.b)-at-2))
}
