package meta

import "errors"

// Results of a request that are answers, not failures: the connection is
// fine and the request was carried out as asked.
var (
	// ErrMiss: mg found no item (EN).
	ErrMiss = errors.New("meta: cache miss")
	// ErrNotStored: ms or ma did not store (NS), e.g. an add of a present
	// key, a replace or append of an absent one.
	ErrNotStored = errors.New("meta: item not stored")
	// ErrExists: the compared CAS did not match (EX).
	ErrExists = errors.New("meta: item modified since its CAS was read")
	// ErrNotFound: md, ma, or ms with a CAS found no item (NF).
	ErrNotFound = errors.New("meta: item not found")
)

var (
	// ErrInvalidKey: a key memcached would refuse (empty, longer than 250
	// bytes, or with a space or a control character); nothing was sent.
	ErrInvalidKey = errors.New("meta: invalid key")

	// ErrUnknownCommand is the server's ERROR reply: it does not know the
	// command. A meta command answered so means the server predates the
	// meta protocol; see [ErrNoMeta].
	ErrUnknownCommand = errors.New("meta: server answered ERROR (unknown command)")

	// ErrNoMeta: the server does not speak the meta protocol, which needs
	// memcached 1.6 or later; use the classic text protocol with it.
	ErrNoMeta = errors.New("meta: server does not speak the meta protocol (needs memcached 1.6 or later)")

	// ErrProtocol is wrapped by every error about a malformed reply: the
	// error's text names what was wrong. The connection is closed.
	ErrProtocol = errors.New("meta: protocol error")

	// ErrConnClosed: the connection or pool was closed, by Close or after
	// a failure; the error that closed it is wrapped beside it.
	ErrConnClosed = errors.New("meta: connection closed")

	// ErrQuiet: a single request asked for quiet mode (q), whose reply
	// may never come; quiet requests are only sent by batches ended by mn.
	ErrQuiet = errors.New("meta: quiet (q) requests are only sent in batches")

	// ErrTooLarge: a reply carried a value larger than the reader's bound
	// (see Options.MaxValueSize). Its bytes were read and dropped, so the
	// connection stays in step and usable; only the request that asked
	// for the value fails.
	ErrTooLarge = errors.New("meta: value larger than the bound")
)

// ServerError is a SERVER_ERROR reply: the server could not carry out the
// request (e.g. "out of memory storing object"). It is the server's answer,
// not a transport failure; the connection stays usable.
type ServerError struct {
	Msg string
}

func (e *ServerError) Error() string { return "meta: SERVER_ERROR " + e.Msg }

// ClientError is a CLIENT_ERROR reply: the server refused the request,
// e.g. "cannot increment or decrement non-numeric value". memcached stays
// in step after it (it skips a refused ms's value), and so does the
// connection.
type ClientError struct {
	Msg string
}

func (e *ClientError) Error() string { return "meta: CLIENT_ERROR " + e.Msg }
