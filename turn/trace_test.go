package turn_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/wsgateway/wsgateway/internal/tracing"
	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/turn"
)

// TestOutcomeTraced: the span of a traced turn records its outcome and the code of the
// RUN_ERROR its log ends with, whoever appended it; none when the log ends otherwise.
func TestOutcomeTraced(t *testing.T) {
	store := openStore(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	tests := []struct {
		name    string
		agent   agentFunc
		outcome metrics.Outcome
		code    string
	}{
		{"finished", func(ctx context.Context, emit func([]byte) error) error {
			return emitAll(emit, started, finished)
		}, metrics.OutcomeCompleted, ""},
		{"interrupted", func(ctx context.Context, emit func([]byte) error) error {
			return emitAll(emit, started, `{"type":"RUN_FINISHED","threadId":"t1","runId":"r","outcome":{"type":"interrupt","interrupts":[{"id":"i1","reason":"approval_required"}]}}`)
		}, metrics.OutcomeCompleted, ""},
		{"the agent's RUN_ERROR", func(ctx context.Context, emit func([]byte) error) error {
			return emitAll(emit, started, `{"type":"RUN_ERROR","message":"quota","code":"upstream_quota"}`)
		}, metrics.OutcomeCompleted, "upstream_quota"},
		{"the agent's RUN_ERROR without a code", func(ctx context.Context, emit func([]byte) error) error {
			return emitAll(emit, started, `{"type":"RUN_ERROR","message":"quota"}`)
		}, metrics.OutcomeCompleted, ""},
		{"a RUN_ERROR after RUN_FINISHED", func(ctx context.Context, emit func([]byte) error) error {
			return emitAll(emit, started, finished, `{"type":"RUN_ERROR","message":"late","code":"late"}`)
		}, metrics.OutcomeCompleted, "late"},
		{"a run after a RUN_ERROR", func(ctx context.Context, emit func([]byte) error) error {
			return emitAll(emit, started, `{"type":"RUN_ERROR","message":"quota","code":"upstream_quota"}`, started, finished)
		}, metrics.OutcomeCompleted, ""},
		{"agent error after its own RUN_ERROR", func(ctx context.Context, emit func([]byte) error) error {
			if err := emitAll(emit, started, `{"type":"RUN_ERROR","message":"quota","code":"upstream_quota"}`); err != nil {
				return err
			}
			return errors.New("model unreachable")
		}, metrics.OutcomeAgentError, "upstream_quota"},
		{"agent error", func(ctx context.Context, emit func([]byte) error) error {
			if err := emitAll(emit, started, msgStart); err != nil {
				return err
			}
			return errors.New("model unreachable")
		}, metrics.OutcomeAgentError, turn.CodeAgentError},
		{"missing terminal", func(ctx context.Context, emit func([]byte) error) error {
			return emitAll(emit, started, chunk)
		}, metrics.OutcomeIncomplete, turn.CodeIncomplete},
	}
	// check runs agent as a traced turn (stopped by stop once it started, when not nil) and
	// checks its outcome and the span's.
	check := func(t *testing.T, runID string, agent agentFunc, stop func(*turn.Turn), outcome metrics.Outcome, code string) {
		w, err := store.Create(context.Background(), principal, runID, "t1")
		if err != nil {
			t.Fatalf("Create() = %v", err)
		}
		startedCh := make(chan struct{})
		if stop != nil {
			agent = blockingAgent(startedCh)
		}
		ctx, span := tp.Tracer("test").Start(context.Background(), runID)
		tr, err := turn.Start(turn.Config{Input: input(t, runID), Agent: agent, Log: w, Context: ctx})
		if err != nil {
			t.Fatalf("Start() = %v", err)
		}
		if stop != nil {
			<-startedCh
			stop(tr)
		}
		if err := tr.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		span.End()
		if got := tr.Outcome(); got != outcome {
			t.Errorf("Outcome() = %s, want %s", got, outcome)
		}
		var attrs map[string]string
		for _, s := range rec.Ended() {
			if s.Name() != runID {
				continue
			}
			attrs = map[string]string{}
			for _, kv := range s.Attributes() {
				attrs[string(kv.Key)] = kv.Value.AsString()
			}
		}
		if attrs == nil {
			t.Fatal("no ended span of the turn")
		}
		if got := attrs[string(tracing.KeyOutcome)]; got != string(outcome) {
			t.Errorf("span outcome = %q, want %q", got, outcome)
		}
		if got, ok := attrs[string(tracing.KeyCode)]; got != code || ok != (code != "") {
			t.Errorf("span code = %q (set %v), want %q", got, ok, code)
		}
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			check(t, fmt.Sprintf("traced-%d", i), tt.agent, nil, tt.outcome, tt.code)
		})
	}
	t.Run("aborted", func(t *testing.T) {
		check(t, "traced-aborted", nil, (*turn.Turn).Abort, metrics.OutcomeAborted, turn.CodeAborted)
	})
	t.Run("shutdown", func(t *testing.T) {
		check(t, "traced-shutdown", nil, (*turn.Turn).Shutdown, metrics.OutcomeShutdown, turn.CodeShutdown)
	})
}
