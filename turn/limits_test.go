package turn_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/turn"
)

// contentOf returns a TEXT_MESSAGE_CONTENT of message m1 whose delta is n bytes.
func contentOf(n int) string {
	return `{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"` + strings.Repeat("x", n) + `"}`
}

// flood emits RUN_STARTED, TEXT_MESSAGE_START and then contents until emit refuses one; it
// reports the refusal, which must wrap ErrLimit, as its own error.
func flood(delta int) agentFunc {
	return func(ctx context.Context, emit func([]byte) error) error {
		if err := emitAll(emit, started, msgStart); err != nil {
			return err
		}
		for i := 0; i < 1000; i++ {
			if err := emit([]byte(contentOf(delta))); err != nil {
				if !errors.Is(err, turn.ErrLimit) {
					return fmt.Errorf("emit = %v, want ErrLimit", err)
				}
				return err
			}
		}
		return errors.New("emit never refused an event")
	}
}

func TestLimits(t *testing.T) {
	store := openStore(t)
	content2 := "TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT"
	maxBytes := int64(len(started) + len(msgStart) + 2*len(contentOf(100)))
	tests := []struct {
		name    string
		limits  turn.Limits
		agent   turn.Agent
		want    string // event types of the log
		message string // of the final RUN_ERROR
	}{
		{"events", turn.Limits{MaxEvents: 4}, flood(1),
			"CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START " + content2 + " RUN_ERROR:limit_exceeded",
			"the run exceeds its limit of 4 events (max-run-events)"},
		{"bytes", turn.Limits{MaxBytes: maxBytes}, flood(100), // exactly two contents fit
			"CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START " + content2 + " RUN_ERROR:limit_exceeded",
			fmt.Sprintf("the run exceeds its limit of %d bytes of events (max-run-bytes)", maxBytes)},
		{"one event", turn.Limits{MaxEventBytes: 1000}, agentFunc(func(ctx context.Context, emit func([]byte) error) error {
			if err := emitAll(emit, started, msgStart, contentOf(900)); err != nil {
				return err
			}
			return emitAll(emit, contentOf(1000), msgEnd, finished)
		}),
			"CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT RUN_ERROR:limit_exceeded",
			fmt.Sprintf("an event of %d bytes exceeds the limit of 1000 bytes per event (max-event-bytes)", len(contentOf(1000)))},
		{"default size of one event", turn.Limits{}, agentFunc(func(ctx context.Context, emit func([]byte) error) error {
			return emitAll(emit, started, msgStart, contentOf(turn.DefaultMaxEventBytes), finished)
		}),
			"CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START RUN_ERROR:limit_exceeded",
			fmt.Sprintf("an event of %d bytes exceeds the limit of %d bytes per event (max-event-bytes)", len(contentOf(turn.DefaultMaxEventBytes)), turn.DefaultMaxEventBytes)},
		{"chunk stream ended before the RUN_ERROR", turn.Limits{MaxEvents: 3}, agentFunc(func(ctx context.Context, emit func([]byte) error) error {
			return emitAll(emit, started, chunk, chunk, finished)
		}),
			"CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_ERROR:limit_exceeded",
			"the run exceeds its limit of 3 events (max-run-events)"},
		{"agent ignoring the refusal", turn.Limits{MaxEvents: 2}, agentFunc(func(ctx context.Context, emit func([]byte) error) error {
			for _, e := range []string{started, msgStart, content, content, msgEnd, finished} {
				emit([]byte(e))
			}
			return nil
		}),
			"CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START RUN_ERROR:limit_exceeded",
			"the run exceeds its limit of 2 events (max-run-events)"},
		{"within every limit", turn.Limits{MaxEvents: 5}, agentFunc(func(ctx context.Context, emit func([]byte) error) error {
			return emitAll(emit, started, msgStart, content, msgEnd, finished)
		}),
			"CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED", ""},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runID := fmt.Sprintf("limit-%d", i)
			ctx := context.Background()
			w, err := store.Create(ctx, principal, runID, "t1")
			if err != nil {
				t.Fatalf("Create() = %v", err)
			}
			sk := newSink()
			tr, err := turn.Start(turn.Config{Input: input(t, runID), Agent: tt.agent, Log: w, Sink: sk, Limits: tt.limits})
			if err != nil {
				t.Fatalf("Start() = %v", err)
			}
			if err := tr.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			logged := readLog(t, store, runID)
			if delivered := sk.snapshot(); strings.Join(delivered, "\n") != strings.Join(logged, "\n") {
				t.Errorf("delivered:\n%s\nwant the log:\n%s", strings.Join(delivered, "\n"), strings.Join(logged, "\n"))
			}
			_, events := parseEnvelopes(t, logged)
			if got := typesOf(events); got != tt.want {
				t.Errorf("log = %s\nwant  %s", got, tt.want)
			}
			last := events[len(events)-1]
			if tt.message != "" && last.Message != tt.message {
				t.Errorf("final message = %q, want %q", last.Message, tt.message)
			}
			wantOutcome := metrics.OutcomeLimitExceeded
			if tt.message == "" {
				wantOutcome = metrics.OutcomeCompleted
			}
			if got := tr.Outcome(); got != wantOutcome {
				t.Errorf("Outcome() = %s, want %s", got, wantOutcome)
			}
			checkVerified(t, logged)
		})
	}
}

// checkVerified runs the log's events, without the run.accepted marker, through the
// verifier: a log ended by a limit is one clients accept.
func checkVerified(t *testing.T, logged []string) {
	t.Helper()
	var ndjson strings.Builder
	for _, f := range logged[1:] {
		var env envelope
		if err := json.Unmarshal([]byte(f), &env); err != nil {
			t.Fatal(err)
		}
		ndjson.Write(env.Chunk)
		ndjson.WriteByte('\n')
	}
	var out strings.Builder
	if err := protocol.VerifyStream(strings.NewReader(ndjson.String()), &out, protocol.PipelineOptions{}); err != nil {
		t.Errorf("the log does not verify: %v\n%s", err, ndjson.String())
	}
}

func TestLimitsInvalid(t *testing.T) {
	store := openStore(t)
	w, err := store.Create(context.Background(), principal, "limit-invalid", "t1")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(context.Background())
	for _, l := range []turn.Limits{{MaxEvents: -1}, {MaxBytes: -1}, {MaxEventBytes: -1}} {
		_, err := turn.Start(turn.Config{Input: input(t, "limit-invalid"), Agent: flood(1), Log: w, Limits: l})
		if !errors.Is(err, turn.ErrConfig) {
			t.Errorf("Start(Limits %+v) = %v, want ErrConfig", l, err)
		}
	}
}

// TestHostileAgents: an agent emitting a 100 MB event, garbage, or nothing at all.
func TestHostileAgents(t *testing.T) {
	store := openStore(t)
	tests := []struct {
		name    string
		limits  turn.Limits
		agent   agentFunc
		want    string
		message string // prefix of the final RUN_ERROR's message
	}{
		{"a 100 MB event", turn.Limits{}, func(ctx context.Context, emit func([]byte) error) error {
			if err := emitAll(emit, started, msgStart); err != nil {
				return err
			}
			return emit([]byte(contentOf(100 << 20)))
		}, "CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START RUN_ERROR:limit_exceeded",
			fmt.Sprintf("an event of %d bytes exceeds the limit of %d bytes per event", len(contentOf(100<<20)), turn.DefaultMaxEventBytes)},
		{"garbage", turn.Limits{}, func(ctx context.Context, emit func([]byte) error) error {
			if err := emitAll(emit, started); err != nil {
				return err
			}
			return emit([]byte("\x00\xff not an event"))
		}, "CUSTOM:run.accepted RUN_STARTED RUN_ERROR:protocol_violation", ""},
		{"nothing at all", turn.Limits{IdleTimeout: 300 * time.Millisecond}, func(ctx context.Context, emit func([]byte) error) error {
			<-ctx.Done()
			return ctx.Err()
		}, "CUSTOM:run.accepted RUN_ERROR:limit_exceeded", "the agent emitted no event for 300ms (agent-idle-timeout)"},
		{"nothing after a while", turn.Limits{IdleTimeout: 300 * time.Millisecond}, func(ctx context.Context, emit func([]byte) error) error {
			for _, e := range []string{started, msgStart, content} {
				time.Sleep(100 * time.Millisecond) // each emit restarts the idle timer
				if err := emit([]byte(e)); err != nil {
					return err
				}
			}
			<-ctx.Done()
			return ctx.Err()
		}, "CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT RUN_ERROR:limit_exceeded", "the agent emitted no event for 300ms (agent-idle-timeout)"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runID := fmt.Sprintf("hostile-%d", i)
			w, err := store.Create(context.Background(), principal, runID, "t1")
			if err != nil {
				t.Fatal(err)
			}
			sk := newSink()
			tr, err := turn.Start(turn.Config{Input: input(t, runID), Agent: tt.agent, Log: w, Sink: sk, Limits: tt.limits})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := tr.Wait(ctx); err != nil {
				t.Fatalf("the turn did not end: %v", err)
			}
			logged := readLog(t, store, runID)
			_, events := parseEnvelopes(t, logged)
			if got := typesOf(events); got != tt.want {
				t.Errorf("log = %s\nwant  %s", got, tt.want)
			}
			if last := events[len(events)-1]; !strings.HasPrefix(last.Message, tt.message) {
				t.Errorf("final message = %q, want it to start with %q", last.Message, tt.message)
			}
			checkVerified(t, logged)
		})
	}
}
