package dns

import (
	"context"
	"fmt"
	"strings"
)

// This file turns answers into records: the search list, the response
// codes, and CNAME chains.

// maxCNAMEs is the longest CNAME chain followed within one answer.
const maxCNAMEs = 8

// Answer is what a lookup found.
type Answer struct {
	// Name is the name that answered: the one asked, or with a suffix of
	// the search list. It is in lower case, without the trailing dot.
	Name string
	// Records are the answer's records of the type asked, for Name or the
	// end of its CNAME chain; none for a name that exists without them.
	Records []Record
	// Additional holds the additional section's records (such as the
	// addresses of SRV targets).
	Additional []Record
	// TTL is the least TTL of Records and the CNAMEs that led to them, in
	// seconds; 0 without records.
	TTL uint32
}

// Lookup asks for the records of type t of name. A name with fewer dots
// than Ndots (and not ending in a dot) is asked with each suffix of Search
// first, then as given; one with at least Ndots dots is asked as given
// first. A name that does not exist (NXDOMAIN), or exists without records
// of type t, moves on to the next; the first with records is returned. If
// none has records it returns the first that exists, with none, or if none
// exists an *Error wrapping ErrNotFound. Any other failure ends the lookup
// with an *Error wrapping ErrServerFailure, ErrRefused, ErrTimeout,
// ErrMalformed or the network's error.
func (c *Client) Lookup(ctx context.Context, name string, t Type) (Answer, error) {
	names := c.candidates(name)
	fail := func(err error) (Answer, error) {
		return Answer{}, &Error{Name: name, Type: t, Server: c.Server, Tried: names, Err: err}
	}
	var empty *Answer
	for _, n := range names {
		m, err := c.Exchange(ctx, n, t)
		if err != nil {
			return fail(err)
		}
		switch m.RCode {
		case RCodeSuccess:
		case RCodeNXDomain:
			continue
		case RCodeServFail:
			return fail(ErrServerFailure)
		case RCodeRefused:
			return fail(ErrRefused)
		default:
			return fail(fmt.Errorf("the DNS server answered with response code %d", m.RCode))
		}
		a, err := answer(m, n, t)
		if err != nil {
			return fail(err)
		}
		if len(a.Records) > 0 {
			return a, nil
		}
		if empty == nil {
			empty = &a
		}
	}
	if empty != nil {
		return *empty, nil
	}
	return fail(ErrNotFound)
}

// candidates returns the names to ask for name, in order (see Lookup).
func (c *Client) candidates(name string) []string {
	if strings.HasSuffix(name, ".") || len(c.Search) == 0 {
		return []string{strings.TrimSuffix(name, ".")}
	}
	var ns []string
	for _, s := range c.Search {
		if s = strings.Trim(s, "."); s != "" {
			ns = append(ns, name+"."+s)
		}
	}
	if strings.Count(name, ".") >= c.Ndots {
		return append([]string{name}, ns...)
	}
	return append(ns, name)
}

// answer takes the records of type t for name from m, following CNAMEs.
func answer(m Message, name string, t Type) (Answer, error) {
	a := Answer{Name: strings.ToLower(strings.TrimSuffix(name, ".")), Additional: m.Additional}
	owner := a.Name
	var ttl uint32
	first := true
	least := func(v uint32) {
		if first || v < ttl {
			ttl, first = v, false
		}
	}
	for hops := 0; ; hops++ {
		var next string
		for _, r := range m.Answers {
			switch {
			case !EqualNames(r.Name, owner):
			case r.Type == t:
				a.Records = append(a.Records, r)
				least(r.TTL)
			case r.Type == TypeCNAME && t != TypeCNAME:
				next = r.Target
				least(r.TTL)
			}
		}
		if len(a.Records) > 0 || next == "" {
			break
		}
		if hops == maxCNAMEs {
			return a, fmt.Errorf("%w: a chain of more than %d CNAMEs from %s", ErrMalformed, maxCNAMEs, a.Name)
		}
		owner = next
	}
	if len(a.Records) > 0 {
		a.TTL = ttl
	}
	return a, nil
}
