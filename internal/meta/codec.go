package meta

import (
	"fmt"
	"strconv"
)

// MaxKeyLen is the longest key memcached accepts, in bytes.
const MaxKeyLen = 250

// CheckKey reports whether key is one memcached accepts: 1 to 250 bytes,
// none of them a space or a control character. The error wraps
// [ErrInvalidKey].
func CheckKey(key string) error {
	if len(key) == 0 {
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: key of %d bytes, longer than %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c <= ' ' || c == 0x7f {
			return fmt.Errorf("%w: byte %#02x at offset %d of key %q is a space or a control character", ErrInvalidKey, c, i, key)
		}
	}
	return nil
}

// GetOptions are the flags of an mg request. The zero value asks only
// whether the key exists (reply HD or EN).
type GetOptions struct {
	Value       bool // v: return the value
	ClientFlags bool // f: return the client flags
	CAS         bool // c: return the CAS token
	TTL         bool // t: return the remaining TTL in seconds (-1: never expires)
	Size        bool // s: return the value's size
	Key         bool // k: return the key
	Quiet       bool // q: no EN on a miss; only for batches ended by mn

	// Opaque, when nonzero, is sent as O<Opaque> and copied back.
	Opaque uint32

	// Touch, when true, sends T<TouchTTL>: the item's TTL becomes TouchTTL
	// seconds (0: never expires) if it is a hit.
	Touch    bool
	TouchTTL int32

	// Vivify, when true, sends N<VivifyTTL>: a miss creates an empty
	// placeholder with that TTL and this caller wins (W); later callers see
	// Z until the placeholder is replaced.
	Vivify    bool
	VivifyTTL int32
}

// AppendGet appends an mg request for key to dst.
func AppendGet(dst []byte, key string, o GetOptions) ([]byte, error) {
	if err := CheckKey(key); err != nil {
		return dst, err
	}
	dst = append(dst, "mg "...)
	dst = append(dst, key...)
	// memcached 1.6 handles flags in order: the flags that change the item
	// come first, so that t reports the TTL they set (mg k T30 t: t30,
	// mg k t T30: the TTL before).
	if o.Vivify {
		dst = appendInt(dst, 'N', int64(o.VivifyTTL))
	}
	if o.Touch {
		dst = appendInt(dst, 'T', int64(o.TouchTTL))
	}
	dst = appendFlag(dst, o.Value, 'v')
	dst = appendFlag(dst, o.ClientFlags, 'f')
	dst = appendFlag(dst, o.CAS, 'c')
	dst = appendFlag(dst, o.TTL, 't')
	dst = appendFlag(dst, o.Size, 's')
	dst = appendFlag(dst, o.Key, 'k')
	dst = appendFlag(dst, o.Quiet, 'q')
	if o.Opaque != 0 {
		dst = appendUint(dst, 'O', uint64(o.Opaque))
	}
	return append(dst, "\r\n"...), nil
}

// Mode is an ms request's mode (its M flag).
type Mode byte

// The modes of ms. The zero Mode is ModeSet.
const (
	ModeSet     Mode = 'S' // store unconditionally
	ModeAdd     Mode = 'E' // store only if the key is absent (NS otherwise)
	ModeReplace Mode = 'R' // store only if the key is present (NS otherwise)
	ModeAppend  Mode = 'A' // append to the present value (NS on a miss)
	ModePrepend Mode = 'P' // prepend to the present value (NS on a miss)
)

// SetOptions are the flags of an ms request. The zero value is a plain
// set that never expires, with client flags 0.
type SetOptions struct {
	TTL         int32  // T<TTL> when nonzero; 0 means never expires
	ClientFlags uint32 // F<ClientFlags> when nonzero
	CompareCAS  uint64 // C<CompareCAS> when nonzero: store only if the CAS matches (EX otherwise)
	Invalidate  bool   // I: with CompareCAS, an older CAS stores the item marked stale
	Mode        Mode   // M<Mode> unless zero or ModeSet
	ReturnCAS   bool   // c: return the new CAS token
	Quiet       bool   // q: no HD on success; only for batches ended by mn
	Opaque      uint32 // O<Opaque> when nonzero
}

// AppendSet appends an ms request for key with value to dst.
func AppendSet(dst []byte, key string, value []byte, o SetOptions) ([]byte, error) {
	if err := CheckKey(key); err != nil {
		return dst, err
	}
	switch o.Mode {
	case 0, ModeSet, ModeAdd, ModeReplace, ModeAppend, ModePrepend:
	default:
		return dst, fmt.Errorf("meta: unknown set mode %q", byte(o.Mode))
	}
	dst = append(dst, "ms "...)
	dst = append(dst, key...)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, int64(len(value)), 10)
	if o.TTL != 0 {
		dst = appendInt(dst, 'T', int64(o.TTL))
	}
	if o.ClientFlags != 0 {
		dst = appendUint(dst, 'F', uint64(o.ClientFlags))
	}
	if o.CompareCAS != 0 {
		dst = appendUint(dst, 'C', o.CompareCAS)
	}
	dst = appendFlag(dst, o.Invalidate, 'I')
	if o.Mode != 0 && o.Mode != ModeSet {
		dst = append(dst, ' ', 'M', byte(o.Mode))
	}
	dst = appendFlag(dst, o.ReturnCAS, 'c')
	dst = appendFlag(dst, o.Quiet, 'q')
	if o.Opaque != 0 {
		dst = appendUint(dst, 'O', uint64(o.Opaque))
	}
	dst = append(dst, "\r\n"...)
	dst = append(dst, value...)
	return append(dst, "\r\n"...), nil
}

// DeleteOptions are the flags of an md request. The zero value deletes
// the item unconditionally.
type DeleteOptions struct {
	CompareCAS uint64 // C<CompareCAS> when nonzero: delete only if the CAS matches (EX otherwise)
	Invalidate bool   // I: keep the item, marked stale, and bump its CAS
	TTL        int32  // T<TTL> when nonzero and Invalidate: the stale item's new TTL
	Quiet      bool   // q: no HD on success; only for batches ended by mn
	Opaque     uint32 // O<Opaque> when nonzero
}

// AppendDelete appends an md request for key to dst.
func AppendDelete(dst []byte, key string, o DeleteOptions) ([]byte, error) {
	if err := CheckKey(key); err != nil {
		return dst, err
	}
	dst = append(dst, "md "...)
	dst = append(dst, key...)
	if o.CompareCAS != 0 {
		dst = appendUint(dst, 'C', o.CompareCAS)
	}
	dst = appendFlag(dst, o.Invalidate, 'I')
	if o.Invalidate && o.TTL != 0 {
		dst = appendInt(dst, 'T', int64(o.TTL))
	}
	dst = appendFlag(dst, o.Quiet, 'q')
	if o.Opaque != 0 {
		dst = appendUint(dst, 'O', uint64(o.Opaque))
	}
	return append(dst, "\r\n"...), nil
}

// ArithOptions are the flags of an ma request. The zero value increments
// by 0, which reads nothing back: set Delta, and Value to read the result.
type ArithOptions struct {
	Decrement bool   // MD instead of the default MI; a decrement stops at 0
	Delta     uint64 // D<Delta>
	// Vivify, when true, sends N<VivifyTTL> J<Initial>: a miss creates the
	// counter with value Initial and that TTL, instead of NF.
	Vivify    bool
	VivifyTTL int32
	Initial   uint64
	// Touch, when true, sends T<TouchTTL>: the TTL set on success.
	Touch    bool
	TouchTTL int32

	Value      bool   // v: return the new value
	TTL        bool   // t: return the remaining TTL
	CAS        bool   // c: return the new CAS token
	CompareCAS uint64 // C<CompareCAS> when nonzero
	Quiet      bool   // q: no HD on success; only for batches ended by mn
	Opaque     uint32 // O<Opaque> when nonzero
}

// AppendArith appends an ma request for key to dst.
func AppendArith(dst []byte, key string, o ArithOptions) ([]byte, error) {
	if err := CheckKey(key); err != nil {
		return dst, err
	}
	dst = append(dst, "ma "...)
	dst = append(dst, key...)
	if o.Decrement {
		dst = append(dst, " MD"...)
	} else {
		dst = append(dst, " MI"...)
	}
	dst = appendUint(dst, 'D', o.Delta)
	if o.Vivify {
		dst = appendInt(dst, 'N', int64(o.VivifyTTL))
		dst = appendUint(dst, 'J', o.Initial)
	}
	if o.Touch {
		dst = appendInt(dst, 'T', int64(o.TouchTTL))
	}
	if o.CompareCAS != 0 {
		dst = appendUint(dst, 'C', o.CompareCAS)
	}
	dst = appendFlag(dst, o.Value, 'v')
	dst = appendFlag(dst, o.TTL, 't')
	dst = appendFlag(dst, o.CAS, 'c')
	dst = appendFlag(dst, o.Quiet, 'q')
	if o.Opaque != 0 {
		dst = appendUint(dst, 'O', uint64(o.Opaque))
	}
	return append(dst, "\r\n"...), nil
}

// AppendNoop appends an mn request, answered MN once every request before
// it on the connection has been answered.
func AppendNoop(dst []byte) []byte {
	return append(dst, "mn\r\n"...)
}

func appendFlag(dst []byte, on bool, f byte) []byte {
	if on {
		dst = append(dst, ' ', f)
	}
	return dst
}

func appendUint(dst []byte, f byte, v uint64) []byte {
	return strconv.AppendUint(append(dst, ' ', f), v, 10)
}

func appendInt(dst []byte, f byte, v int64) []byte {
	return strconv.AppendInt(append(dst, ' ', f), v, 10)
}
