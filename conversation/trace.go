package conversation

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/wsgateway/wsgateway/internal/tracing"
	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/protocol"
)

// noSpan is the span of an untraced turn or replay: every method does nothing.
var noSpan = trace.SpanFromContext(context.Background())

// withRemoteParent returns ctx (nil: none) carrying the W3C trace context of the request's
// headers as the remote parent of the turns or replay it starts, when tracing is on and the
// headers hold a valid one; otherwise ctx unchanged.
func (s *Server) withRemoteParent(ctx context.Context, h http.Header) context.Context {
	if s.tracer == nil {
		return ctx
	}
	sc := tracing.FromHeader(h)
	if !sc.IsValid() {
		return ctx
	}
	if ctx == nil {
		ctx = context.Background()
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// startTurnSpan returns the context of the turn of req, the values of its request with its
// span, and the span, which the caller ends. Its parent is the trace context of the run
// frame's forwardedProps (traceparent, tracestate), else that of the request's headers. With
// tracing off it returns the values and noSpan.
func (s *Server) startTurnSpan(req turnRequest) (context.Context, trace.Span) {
	ctx := req.values
	if s.tracer == nil {
		return ctx, noSpan
	}
	if ctx == nil {
		ctx = context.Background()
	}
	if sc := tracing.Parse(forwardedString(req.in, tracing.PropTraceParent), forwardedString(req.in, tracing.PropTraceState)); sc.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	return s.tracer.Start(ctx, tracing.SpanTurn, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			tracing.KeyRunID.String(req.in.RunID),
			tracing.KeyThreadID.String(req.in.ThreadID),
			tracing.KeyPrincipalHash.String(tracing.PrincipalHash(req.slot.key.principal)),
		))
}

// forwardedString returns the string forwardedProps[key] of in, "" when absent or not a
// string.
func forwardedString(in *protocol.RunAgentInput, key string) string {
	var v string
	if raw := in.ForwardedProp(key); raw != nil && json.Unmarshal(raw, &v) != nil {
		return ""
	}
	return v
}

// replayTrace is the span of one replay (a resume or a join), started once the run's log
// opened: a child of the run's turn (as its metadata records it), or, when the replay's
// request carries a trace context, a child of that one linked to the turn. With tracing
// off, it does nothing.
type replayTrace struct {
	s         *Server
	ctx       context.Context
	principal string
	runID     string
	offset    string
	start     time.Time
	span      trace.Span
	events    int
}

// newReplayTrace returns the trace of a replay whose context is ctx, nil with tracing off.
func (s *Server) newReplayTrace(ctx context.Context, principal, runID, offset string) *replayTrace {
	if s.tracer == nil {
		return nil
	}
	ctx = context.WithoutCancel(ctx) // for its values only
	return &replayTrace{s: s, ctx: ctx, principal: principal, runID: runID, offset: offset, start: time.Now()}
}

// opened starts the span, once, when the reader r opened the run's log.
func (rt *replayTrace) opened(r LogReader) {
	if rt == nil || rt.span != nil {
		return
	}
	ctx := rt.ctx
	var opts []trace.SpanStartOption
	switch turn := r.TraceContext(); {
	case !turn.IsValid():
	case trace.SpanContextFromContext(ctx).IsValid():
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: turn}))
	default:
		ctx = trace.ContextWithRemoteSpanContext(ctx, turn)
	}
	rt.begin(ctx, opts...)
}

// begin starts the span, a child of ctx's span context.
func (rt *replayTrace) begin(ctx context.Context, opts ...trace.SpanStartOption) {
	name := tracing.SpanResume
	if rt.offset == FromStart {
		name = tracing.SpanJoin
	}
	opts = append(opts, trace.WithTimestamp(rt.start), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			tracing.KeyRunID.String(rt.runID),
			tracing.KeyOffset.String(rt.offset),
			tracing.KeyPrincipalHash.String(tracing.PrincipalHash(rt.principal)),
		))
	_, rt.span = rt.s.tracer.Start(ctx, name, opts...)
}

// counting returns send counting the events it sent.
func (rt *replayTrace) counting(send func(context.Context, string, []byte) error) func(context.Context, string, []byte) error {
	return func(ctx context.Context, offset string, event []byte) error {
		err := send(ctx, offset, event)
		if err == nil {
			rt.events++
		}
		return err
	}
}

// end ends the span with the replay's result; a replay whose log never opened has a span
// of its own trace (or of its request's).
func (rt *replayTrace) end(res metrics.ResumeResult) {
	if rt == nil {
		return
	}
	if rt.span == nil {
		rt.begin(rt.ctx)
	}
	rt.span.SetAttributes(tracing.KeyResult.String(string(res)), tracing.KeyEvents.Int(rt.events))
	if res == metrics.ResumeFailed {
		rt.span.SetStatus(codes.Error, string(res))
	}
	rt.span.End()
}
