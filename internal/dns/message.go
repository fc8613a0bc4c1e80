// Package dns is a small DNS client: it builds queries for A, AAAA and SRV
// records, sends them over UDP and again over TCP when the answer is
// truncated, and parses the answers within bounds, since everything in them
// comes from a server that may be wrong or hostile: a message is at most
// 65,535 bytes, a name at most 255 octets on the wire, a compression
// pointer points backwards only, and a section holds at most MaxRecords
// records.
//
// It exists so that the root module needs no DNS library (no
// golang.org/x/net): the standard resolver gives no TTLs, no SRV weights of
// additional records, and no way to tell NXDOMAIN from a timeout portably.
package dns

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Type is a record type.
type Type uint16

// The record types this package asks for or follows.
const (
	TypeA     Type = 1
	TypeCNAME Type = 5
	TypeAAAA  Type = 28
	TypeSRV   Type = 33
	typeOPT   Type = 41 // EDNS(0), RFC 6891
)

func (t Type) String() string {
	switch t {
	case TypeA:
		return "A"
	case TypeCNAME:
		return "CNAME"
	case TypeAAAA:
		return "AAAA"
	case TypeSRV:
		return "SRV"
	case typeOPT:
		return "OPT"
	}
	return "TYPE" + strconv.Itoa(int(t))
}

// Response codes (RFC 1035 4.1.1).
const (
	RCodeSuccess  = 0
	RCodeFormErr  = 1
	RCodeServFail = 2
	RCodeNXDomain = 3
	RCodeNotImp   = 4
	RCodeRefused  = 5
)

const (
	// MaxMessage is the largest message: TCP's two-byte length.
	MaxMessage = 65535
	// MaxRecords is the most records a section may hold. A message of
	// MaxMessage bytes holds at most about 5,900 of the smallest records;
	// this says so before anything is allocated for them.
	MaxRecords = 4096
	// maxNameWire is the longest name on the wire, its length octets and
	// the root included (RFC 1035 3.1).
	maxNameWire = 255
	// maxLabel is the longest label.
	maxLabel = 63
	// udpSize is the UDP payload this client offers in its EDNS(0) record:
	// the size that DNS flag day 2020 settled on, which needs no
	// fragmentation on any common path. Larger answers come over TCP.
	udpSize = 1232
	// headerLen is the fixed header; rrFixed the fixed part of a record
	// after its name.
	headerLen = 12
	rrFixed   = 10
)

// ErrMalformed is wrapped by every error of Parse.
var ErrMalformed = errors.New("malformed DNS message")

// Record is one resource record of the types this package reads. Names are
// in lower case, without the trailing dot; a byte that is not a letter,
// digit, '-' or '_' is written \DDD, and a dot within a label \. (RFC 1035
// 5.1), so that a name that is not a hostname cannot pass for one.
type Record struct {
	Name string
	Type Type
	// TTL is in seconds. A TTL with the high bit set is 0, as RFC 2181
	// section 8 says.
	TTL uint32
	// Addr is an A or AAAA record's address.
	Addr netip.Addr
	// Target is an SRV record's target or a CNAME record's canonical name.
	Target string
	// Priority, Weight and Port are an SRV record's.
	Priority, Weight, Port uint16
}

// Question is a message's question.
type Question struct {
	Name string
	Type Type
}

// Message is a parsed DNS message. The authority section is checked and
// skipped; records of other types than Record holds are skipped too.
type Message struct {
	ID         uint16
	Response   bool
	Truncated  bool
	RCode      int
	Question   Question // the first; a message with more than one is refused
	Answers    []Record
	Additional []Record
}

// Query returns a recursive query for name and t, with an EDNS(0) record
// offering udpSize bytes of UDP payload. name is a domain name in
// presentation form, with or without the trailing dot; a label may hold
// only letters, digits, '-' and '_'.
func Query(id uint16, name string, t Type) ([]byte, error) {
	b := make([]byte, headerLen, headerLen+len(name)+2+4+11)
	b[0], b[1] = byte(id>>8), byte(id)
	b[2] = 0x01 // RD: recursion desired
	b[5] = 1    // QDCOUNT
	b[11] = 1   // ARCOUNT: the OPT record
	b, err := appendName(b, name)
	if err != nil {
		return nil, err
	}
	b = append(b, byte(t>>8), byte(t), 0, 1) // QCLASS IN
	// OPT: root name, type, UDP size in the class, no extended flags, no data.
	return append(b, 0, byte(typeOPT>>8), byte(typeOPT), udpSize>>8, udpSize&0xff, 0, 0, 0, 0, 0, 0), nil
}

// appendName appends name in wire form, uncompressed.
func appendName(b []byte, name string) ([]byte, error) {
	name = strings.TrimSuffix(name, ".")
	if name == "" {
		return append(b, 0), nil
	}
	if len(name)+2 > maxNameWire {
		return nil, fmt.Errorf("name %q is %d characters, more than the %d of a domain name", name, len(name), maxNameWire-2)
	}
	for l := range strings.SplitSeq(name, ".") {
		switch {
		case l == "":
			return nil, fmt.Errorf("name %q has an empty label", name)
		case len(l) > maxLabel:
			return nil, fmt.Errorf("name %q has a label of %d characters, more than %d", name, len(l), maxLabel)
		case !isLDH(l, true):
			return nil, fmt.Errorf("name %q has a label with characters other than letters, digits, '-' and '_'", name)
		}
		b = append(b, byte(len(l)))
		b = append(b, l...)
	}
	return append(b, 0), nil
}

// isLDH reports whether l has only letters, digits and '-' (and '_' if
// underscore, as SRV names have).
func isLDH(l string, underscore bool) bool {
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || underscore && c == '_') {
			return false
		}
	}
	return true
}

// IsHostname reports whether name, as Parse writes names, is a hostname:
// labels of 1 to 63 letters, digits and '-', not starting or ending with
// '-' (RFC 1123 2.1), at most 253 characters.
func IsHostname(name string) bool {
	if name == "" || len(name) > maxNameWire-2 {
		return false
	}
	for l := range strings.SplitSeq(name, ".") {
		if l == "" || len(l) > maxLabel || l[0] == '-' || l[len(l)-1] == '-' || !isLDH(l, false) {
			return false
		}
	}
	return true
}

// EqualNames reports whether two names are the same, ignoring case and a
// trailing dot.
func EqualNames(a, b string) bool {
	return strings.EqualFold(strings.TrimSuffix(a, "."), strings.TrimSuffix(b, "."))
}
