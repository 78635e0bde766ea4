package turn

import (
	"context"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/wsgateway/wsgateway/internal/tracing"
	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/protocol"
)

// turnTrace records a turn on the span of its Config.Context, when that span records: the
// outcome and code, a span of the agent's call, an event when the first event after
// run.accepted is stored, and one span for all the turn's appends. Whoever started the span
// ends it (after Config.OnEnd). A turn whose context holds no recording span has none, and
// pays a nil check per event.
type turnTrace struct {
	span   trace.Span
	tracer trace.Tracer

	// Guarded by the Turn's mu (appendLocked).
	start   time.Time // the first append
	appends int
	bytes   int64
	last    protocol.End // the end of the last event appended; the zero End when it is not a terminal

	maxAck atomic.Int64 // the longest time from an append to its storage, in nanoseconds
}

// newTurnTrace returns the trace of a turn whose context holds span, nil when span does not
// record.
func newTurnTrace(span trace.Span) *turnTrace {
	if !span.IsRecording() {
		return nil
	}
	return &turnTrace{span: span, tracer: span.TracerProvider().Tracer(tracing.Scope)}
}

// observe counts the append of ev and returns stored wrapped to record its storage: its
// latency, and the first event after the marker. The Turn's mu is held.
func (tr *turnTrace) observe(ev *protocol.Event, emitted time.Time, stored func(string, error)) func(string, error) {
	if tr.appends == 0 {
		tr.start = emitted
	}
	tr.appends++
	tr.bytes += int64(len(ev.JSON()))
	tr.last, _ = ev.End()
	first := tr.appends == 2
	return func(offset string, err error) {
		if err == nil {
			now := time.Now()
			d := int64(now.Sub(emitted))
			for m := tr.maxAck.Load(); d > m && !tr.maxAck.CompareAndSwap(m, d); m = tr.maxAck.Load() {
			}
			if first {
				tr.span.AddEvent(tracing.EventFirst, trace.WithTimestamp(now), trace.WithAttributes(
					tracing.KeyEventType.String(string(ev.Type())), tracing.KeyOffset.String(offset)))
			}
		}
		stored(offset, err)
	}
}

// startAgent returns ctx with the span of the agent's call, and the span: an upstream
// agent's request carries it (tracing.Inject).
func (tr *turnTrace) startAgent(ctx context.Context) (context.Context, trace.Span) {
	return tr.tracer.Start(ctx, tracing.SpanAgent, trace.WithSpanKind(trace.SpanKindClient))
}

// endAgent ends the agent's span with the error it returned.
func endAgent(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// end records the turn's outcome, with the code of its last event appended when that is a
// RUN_ERROR, and the span of its appends, which ended when the last was stored (acked).
func (tr *turnTrace) end(t *Turn, outcome metrics.Outcome, acked time.Time) {
	t.mu.Lock()
	code, appends, bytes, start := tr.last.Code, tr.appends, tr.bytes, tr.start
	t.mu.Unlock()
	if outcome == metrics.OutcomeLogFailed {
		code = CodeLogUnavailable
	}
	tracing.SetOutcome(tr.span, string(outcome), code)
	if appends == 0 {
		return
	}
	_, span := tr.tracer.Start(t.cfg.Context, tracing.SpanLogAppends, trace.WithTimestamp(start),
		trace.WithAttributes(tracing.KeyAppends.Int(appends), tracing.KeyAppendBytes.Int64(bytes),
			tracing.KeyAppendMaxMs.Float64(float64(tr.maxAck.Load())/1e6)))
	if outcome == metrics.OutcomeLogFailed {
		span.SetStatus(codes.Error, CodeLogUnavailable)
	}
	span.End(trace.WithTimestamp(acked))
}
