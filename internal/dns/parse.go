package dns

import (
	"fmt"
	"net/netip"
	"strings"
)

// This file parses messages. Every length, count and offset in a message
// comes from its sender: each is checked against the bytes there are
// before it is used, so that no message, however built, makes the parser
// read out of bounds, loop, or allocate more than a small multiple of the
// message's own size.

// Parse parses a DNS message of at most MaxMessage bytes. The answer and
// additional sections keep their A, AAAA, SRV and CNAME records of class
// IN; other records are checked and skipped. Every error wraps
// ErrMalformed and says what is wrong where.
func Parse(b []byte) (Message, error) {
	var m Message
	if len(b) > MaxMessage {
		return m, malformed("the message is %d bytes, more than the %d a DNS message can be", len(b), MaxMessage)
	}
	if len(b) < headerLen {
		return m, malformed("the message is %d bytes, shorter than a DNS header (%d)", len(b), headerLen)
	}
	m.ID = u16(b, 0)
	m.Response = b[2]&0x80 != 0
	m.Truncated = b[2]&0x02 != 0
	m.RCode = int(b[3] & 0x0f)
	qd, an, ns, ar := int(u16(b, 4)), int(u16(b, 6)), int(u16(b, 8)), int(u16(b, 10))
	if qd > 1 {
		return m, malformed("%d questions; a message has at most 1", qd)
	}
	off := headerLen
	if qd == 1 {
		name, next, err := readName(b, off)
		if err != nil {
			return m, fmt.Errorf("the question: %w", err)
		}
		if next+4 > len(b) {
			return m, malformed("the question ends %d bytes past the message", next+4-len(b))
		}
		m.Question = Question{Name: name, Type: Type(u16(b, next))}
		off = next + 4
	}
	var err error
	if m.Answers, off, err = readSection(b, off, an, "answer"); err != nil {
		return m, err
	}
	if _, off, err = readSection(b, off, ns, "authority"); err != nil {
		return m, err
	}
	if m.Additional, _, err = readSection(b, off, ar, "additional"); err != nil {
		return m, err
	}
	return m, nil
}

// readSection reads n records from off; it returns the ones kept and the
// offset past the section.
func readSection(b []byte, off, n int, section string) ([]Record, int, error) {
	if n > MaxRecords {
		return nil, off, malformed("the %s section has %d records, more than the %d this client reads", section, n, MaxRecords)
	}
	// The smallest record is the root name and its fixed part: a count
	// larger than the bytes left can hold is a lie, said before allocating.
	if left := len(b) - off; n*(1+rrFixed) > left {
		return nil, off, malformed("the %s section claims %d records, more than its %d bytes can hold", section, n, left)
	}
	var rs []Record
	for i := range n {
		r, keep, next, err := readRecord(b, off)
		if err != nil {
			return nil, off, fmt.Errorf("record %d of the %s section: %w", i+1, section, err)
		}
		if keep {
			if rs == nil {
				rs = make([]Record, 0, n-i)
			}
			rs = append(rs, r)
		}
		off = next
	}
	return rs, off, nil
}

// readRecord reads the record at off, and reports whether it is one that
// Message keeps.
func readRecord(b []byte, off int) (r Record, keep bool, next int, err error) {
	if r.Name, off, err = readName(b, off); err != nil {
		return r, false, off, err
	}
	if off+rrFixed > len(b) {
		return r, false, off, malformed("the record's fixed part ends %d bytes past the message", off+rrFixed-len(b))
	}
	r.Type = Type(u16(b, off))
	class := u16(b, off+2)
	r.TTL = uint32(u16(b, off+4))<<16 | uint32(u16(b, off+6))
	if r.TTL > 1<<31-1 {
		r.TTL = 0 // RFC 2181 8: a TTL with the high bit set is zero
	}
	rdlen := int(u16(b, off+8))
	start := off + rrFixed
	end := start + rdlen
	if end > len(b) {
		return r, false, off, malformed("the %s record's data of %d bytes ends %d bytes past the message", r.Type, rdlen, end-len(b))
	}
	if class != 1 && r.Type != typeOPT {
		return r, false, end, nil // not IN: not ours
	}
	switch r.Type {
	case TypeA, TypeAAAA:
		want := 4
		if r.Type == TypeAAAA {
			want = 16
		}
		if rdlen != want {
			return r, false, off, malformed("the %s record of %s has %d bytes of data, not %d", r.Type, r.Name, rdlen, want)
		}
		r.Addr, _ = netip.AddrFromSlice(b[start:end])
		return r, true, end, nil
	case TypeSRV:
		if rdlen < 7 {
			return r, false, off, malformed("the SRV record of %s has %d bytes of data, fewer than 7", r.Name, rdlen)
		}
		r.Priority, r.Weight, r.Port = u16(b, start), u16(b, start+2), u16(b, start+4)
		t, tend, err := readName(b, start+6)
		if err != nil {
			return r, false, off, fmt.Errorf("the target of the SRV record of %s: %w", r.Name, err)
		}
		if tend != end {
			return r, false, off, malformed("the SRV record of %s has %d bytes of data, and its target ends at byte %d of them", r.Name, rdlen, tend-start)
		}
		r.Target = t
		return r, true, end, nil
	case TypeCNAME:
		t, tend, err := readName(b, start)
		if err != nil {
			return r, false, off, fmt.Errorf("the CNAME record of %s: %w", r.Name, err)
		}
		if tend != end {
			return r, false, off, malformed("the CNAME record of %s has %d bytes of data, and its name ends at byte %d of them", r.Name, rdlen, tend-start)
		}
		r.Target = t
		return r, true, end, nil
	}
	return r, false, end, nil
}

// readName reads the name at off, following compression pointers, and
// returns it with the offset past it where it started. A pointer must
// point before the label that holds it, so that pointers cannot loop; the
// name, uncompressed, is at most maxNameWire octets.
func readName(b []byte, off int) (string, int, error) {
	var sb strings.Builder
	wire := 1  // the root's octet
	next := -1 // the offset after the name where it started
	floor := off
	for {
		if off >= len(b) {
			return "", 0, malformed("a name runs past the end of the message at byte %d", off)
		}
		c := int(b[off])
		switch c & 0xc0 {
		case 0x00:
		case 0xc0:
			if off+1 >= len(b) {
				return "", 0, malformed("a compression pointer at byte %d is cut off by the end of the message", off)
			}
			p := int(u16(b, off) & 0x3fff)
			if p >= floor {
				return "", 0, malformed("a compression pointer at byte %d points forward, to byte %d, which could loop", off, p)
			}
			if next < 0 {
				next = off + 2
			}
			off, floor = p, p
			continue
		default:
			return "", 0, malformed("a label at byte %d has the reserved type bits %#x", off, c&0xc0)
		}
		if c == 0 {
			if next < 0 {
				next = off + 1
			}
			return sb.String(), next, nil
		}
		if off+1+c > len(b) {
			return "", 0, malformed("a label of %d bytes at byte %d runs past the end of the message", c, off)
		}
		if wire += 1 + c; wire > maxNameWire {
			return "", 0, malformed("a name at byte %d is longer than the %d octets of a domain name", off, maxNameWire)
		}
		if sb.Len() > 0 {
			sb.WriteByte('.')
		}
		writeLabel(&sb, b[off+1:off+1+c])
		off += 1 + c
	}
}

// writeLabel writes l in presentation form, lower case, with every byte
// that is not a letter, digit, '-' or '_' escaped.
func writeLabel(sb *strings.Builder, l []byte) {
	for _, c := range l {
		switch {
		case 'A' <= c && c <= 'Z':
			sb.WriteByte(c + 'a' - 'A')
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '_':
			sb.WriteByte(c)
		case c == '.' || c == '\\':
			sb.WriteByte('\\')
			sb.WriteByte(c)
		default:
			fmt.Fprintf(sb, "\\%03d", c)
		}
	}
}

func u16(b []byte, off int) uint16 { return uint16(b[off])<<8 | uint16(b[off+1]) }

func malformed(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, a...)...)
}
