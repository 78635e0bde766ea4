// Package tracing holds what the gateway's packages share to trace turns with OpenTelemetry:
// the span and attribute names, the W3C trace context in its text form, and the hash that
// stands for a principal in spans.
//
// The packages that record spans depend on the OpenTelemetry API only; the SDK and the
// exporter are chosen in main. A package records nothing when it is given no tracer provider
// (conversation.Config.TracerProvider nil), or when the span of its context does not record
// (turn): tracing off costs a nil check per turn and nothing per event.
package tracing

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Scope is the instrumentation scope of the gateway's spans.
const Scope = "github.com/wsgateway/wsgateway"

// Span names.
const (
	SpanTurn       = "turn"        // a turn, from its run frame (or POST) to its log's close
	SpanAgent      = "agent"       // the agent's call (an upstream request for agui and openai)
	SpanLogAppends = "log appends" // the turn's appends to its log, aggregated
	SpanResume     = "resume"      // a replay of a run's log after an offset
	SpanJoin       = "join"        // a replay of a run's log from its start
	SpanTakeover   = "takeover"    // a turn taken over from a dead gateway, to its log's close
	EventFirst     = "first event" // on the turn span: the first event after run.accepted is stored
)

// Attribute keys.
const (
	KeyRunID         = attribute.Key("wsgateway.run_id")
	KeyThreadID      = attribute.Key("wsgateway.thread_id")
	KeyPrincipalHash = attribute.Key("wsgateway.principal_hash")
	KeyOutcome       = attribute.Key("wsgateway.outcome")
	KeyCode          = attribute.Key("wsgateway.code")
	KeyEventType     = attribute.Key("wsgateway.event_type")
	KeyOffset        = attribute.Key("wsgateway.offset")
	KeyAppends       = attribute.Key("wsgateway.log.appends")
	KeyAppendBytes   = attribute.Key("wsgateway.log.bytes")
	KeyAppendMaxMs   = attribute.Key("wsgateway.log.append_max_ms")
	KeyEvents        = attribute.Key("wsgateway.events")
	KeyResult        = attribute.Key("wsgateway.result")
	KeyTakeovers     = attribute.Key("wsgateway.takeovers")
	KeyStatusCode    = attribute.Key("http.response.status_code")
	// On the turn span: the messages its agent was given from its thread, their bytes, and
	// the messages the history's byte budget left out.
	KeyHistoryMessages = attribute.Key("wsgateway.agent_history.messages")
	KeyHistoryBytes    = attribute.Key("wsgateway.agent_history.bytes")
	KeyHistoryDropped  = attribute.Key("wsgateway.agent_history.dropped")
)

// Fields of the W3C trace context in a run frame's forwardedProps (PROTOCOL.md section 2), and
// its HTTP headers.
const (
	PropTraceParent = "traceparent"
	PropTraceState  = "tracestate"
)

var w3c propagation.TraceContext

// Parse returns the span context of a W3C traceparent and tracestate; it is invalid when
// traceparent is not a valid one.
func Parse(traceparent, tracestate string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	c := propagation.MapCarrier{PropTraceParent: traceparent}
	if tracestate != "" {
		c[PropTraceState] = tracestate
	}
	return trace.SpanContextFromContext(w3c.Extract(context.Background(), c))
}

// FromHeader returns the span context of the traceparent and tracestate headers of h.
func FromHeader(h http.Header) trace.SpanContext {
	return Parse(h.Get(PropTraceParent), h.Get(PropTraceState))
}

// Format returns the W3C traceparent and tracestate of sc, "" when sc is invalid.
func Format(sc trace.SpanContext) (traceparent, tracestate string) {
	if !sc.IsValid() {
		return "", ""
	}
	c := propagation.MapCarrier{}
	w3c.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
	return c[PropTraceParent], c[PropTraceState]
}

// Inject sets the traceparent (and tracestate) headers of h from the span of ctx, if any:
// an upstream agent's request continues the turn's trace.
func Inject(ctx context.Context, h http.Header) {
	w3c.Inject(ctx, propagation.HeaderCarrier(h))
}

// PrincipalHash stands for a principal in spans: the first 8 bytes of a SHA-256 of it, in
// hex. It tells the turns of one principal from another's without naming it; like any
// unkeyed hash, it confirms a guessed principal to whoever reads the traces.
func PrincipalHash(principal string) string {
	h := sha256.Sum256([]byte("principal\x00" + principal))
	return hex.EncodeToString(h[:8])
}

// SetOutcome records how a turn ended on its span: the outcome, the code of its RUN_ERROR
// ("" for none), and an error status for a failure of the agent or of the gateway: every
// outcome but completed (with no RUN_ERROR of the agent's), aborted and shutdown.
func SetOutcome(span trace.Span, outcome, code string) {
	span.SetAttributes(KeyOutcome.String(outcome))
	if code != "" {
		span.SetAttributes(KeyCode.String(code))
	}
	switch {
	case outcome == "aborted", outcome == "shutdown", outcome == "completed" && code == "":
	case code != "":
		span.SetStatus(codes.Error, code)
	default:
		span.SetStatus(codes.Error, outcome)
	}
}
