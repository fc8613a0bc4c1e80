package selectorotel

import (
	"context"

	selector "github.com/kubecache/k8s-memcache-selector"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// This file is the traces: the spans of the Client's operations, from
// selector.Metrics' Begin, Step and End, named and with attributes as
// OpenTelemetry's semantic conventions for database client spans have
// them. Without Options.TracerProvider, each returns at once.

// The attributes and events of the spans that the metrics do not have.
const (
	batchSize     = attribute.Key("db.operation.batch.size")
	outcomeKey    = attribute.Key(prefix + "outcome")
	fromKey       = attribute.Key(prefix + "from")
	errorType     = attribute.Key("error.type")
	eventRetry    = prefix + "retry"
	eventFailover = prefix + "failover"
	eventHandoff  = prefix + "handoff"
)

// Begin implements selector.Metrics: it starts the span of a Client
// operation, a child of ctx's span, and returns the context holding it.
func (m *Metrics) Begin(ctx context.Context, op string) context.Context {
	if m.tracer == nil {
		return ctx
	}
	ctx, _ = m.tracer.Start(ctx, string(op), m.spanOpts.get(op, func(op string) []trace.SpanStartOption {
		return []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(system, opKey.String(string(op)))}
	})...)
	return ctx
}

// End implements selector.Metrics: it records the operation's duration and
// keys, and ends its span, with its outcome, and for an error (not a miss,
// nor memcached's other answers: not stored, a CAS conflict), error.type,
// the error recorded, and the status Error.
func (m *Metrics) End(ctx context.Context, e selector.RequestEvent, err error) {
	m.request(e)
	if m.tracer == nil {
		return
	}
	span := trace.SpanFromContext(ctx)
	if span.IsRecording() {
		span.SetAttributes(outcomeKey.String(string(e.Outcome)))
		if n := e.Hits + e.Misses; e.Op == "get_multi" && n > 1 {
			span.SetAttributes(batchSize.Int(n))
		}
		failed(span, e.Outcome, err)
	}
	span.End()
}

// failed records err, of Outcome o, on span if it is an error.
func failed(span trace.Span, o selector.Outcome, err error) {
	if err == nil || !isError(o) {
		return
	}
	span.SetAttributes(errorType.String(string(o)))
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

// Step implements selector.Metrics: the server of an operation's request
// is its span's server.address and server.port (the last one's, after a
// retry or failover); a GetMulti's request to one server is a span of its
// own, under the operation's; a retry, a failover and a handoff are events
// of the operation's span.
func (m *Metrics) Step(ctx context.Context, e selector.StepEvent) {
	if m.tracer == nil {
		return
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	server := m.serverOf(e.Addr)
	switch e.Kind {
	case selector.StepRequest:
		if e.Keys > 0 {
			m.serverSpan(ctx, e, server)
			return
		}
		span.SetAttributes(server...)
	case selector.StepRetry:
		span.AddEvent(eventRetry, trace.WithAttributes(with(server, errorType.String(string(e.Outcome)))...))
	case selector.StepFailover:
		span.AddEvent(eventFailover, trace.WithAttributes(with(server, fromKey.String(e.From))...))
	case selector.StepHandoff:
		span.AddEvent(eventHandoff, trace.WithAttributes(with(server, fromKey.String(e.From), outcomeKey.String(string(e.Outcome)))...))
	}
}

// serverSpan records a GetMulti's request to one server as a span under
// ctx's, named "get_multi host:port", the semantic conventions' operation
// and target.
func (m *Metrics) serverSpan(ctx context.Context, e selector.StepEvent, server []attribute.KeyValue) {
	kvs := with(server, system, opKey.String(string("get_multi")), outcomeKey.String(string(e.Outcome)))
	if e.Keys > 1 {
		kvs = append(kvs, batchSize.Int(e.Keys))
	}
	_, span := m.tracer.Start(ctx, string("get_multi")+" "+e.Addr,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(e.Start), trace.WithAttributes(kvs...))
	failed(span, e.Outcome, e.Err)
	span.End(trace.WithTimestamp(e.Start.Add(e.Duration)))
}

// serverOf returns server.address and server.port of the server at
// addr, host:port (see serverKVs), made once a server.
func (m *Metrics) serverOf(addr string) []attribute.KeyValue {
	return m.spanServer.get(addr, func(addr string) []attribute.KeyValue { return serverKVs(addr)[1:] }) // without db.system.name, the span's
}

// with returns kvs and more in a new slice: kvs is shared.
func with(kvs []attribute.KeyValue, more ...attribute.KeyValue) []attribute.KeyValue {
	return append(append(make([]attribute.KeyValue, 0, len(kvs)+len(more)+1), kvs...), more...)
}
