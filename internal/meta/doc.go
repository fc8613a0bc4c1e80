// Package meta speaks memcached's meta protocol (memcached 1.6 or later):
// a codec, a pipelined connection that many goroutines share ([Conn]),
// and a small per-server pool of them ([Pool]) with a typed API: Get,
// Set, Delete, Arith, GetMulti, Noop, and Detect for first contact.
//
// # Codec
//
// [AppendGet], [AppendSet], [AppendDelete], [AppendArith] and
// [AppendNoop] append one request (mg, ms, md, ma, mn) to a caller's
// buffer and allocate nothing; keys are checked as memcached requires
// ([CheckKey]). [ReadReply] parses one reply from a *bufio.Reader into a
// caller's [Reply]: its status (HD, VA, EN, NF, NS, EX, MN), its return
// flags (t, f, c, s, k, O, W, X, Z), and its value, for which it
// allocates at most the value's size, as its bytes arrive; a value over
// the bound given is read and dropped ([ErrTooLarge]), and lines are
// bounded by [MaxLineLen].
//
// # Conn and Pool
//
// A [Conn] writes the requests of all its callers in order, coalescing
// those that meet into one write, and matches replies in order; the
// callers read the replies themselves, one at a time, with no goroutine
// of its own; see [Conn] for cancellation and timeouts. A [Pool]
// dials up to MaxConns of them lazily through a caller's dial function
// and sends each request to the least loaded. A single Get that hits
// allocates its value and nothing else. ItemSizeMax asks the server for
// its item size limit (memcached's -I), which SetMaxValueSize makes the
// bound on the values read.
//
// # Errors
//
// Answers that are not successes are sentinels: [ErrMiss] (EN),
// [ErrNotStored] (NS), [ErrExists] (EX), [ErrNotFound] (NF). The server's
// error replies are typed: [*ServerError] (SERVER_ERROR, e.g. out of
// memory or a value too large) and [*ClientError] (CLIENT_ERROR), after
// which the connection stays usable, as it does after [ErrTooLarge] (a
// value over the reader's bound, read and dropped); after
// [ErrUnknownCommand] (ERROR) it is closed, and a server that answers mn
// with ERROR predates the meta protocol ([ErrNoMeta]). A malformed reply wraps [ErrProtocol].
// A request on a connection that failed or was closed fails with an
// error wrapping [ErrConnClosed] and the cause: a transport error, a
// protocol error, or, for the connection's timeout,
// os.ErrDeadlineExceeded. A request whose context ended wraps ctx.Err().
//
// The package does not depend on gomemcache: a caller translates these
// results into its own.
package meta
