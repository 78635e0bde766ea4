package turn_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/wsgateway/wsgateway/jetstream"
	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/turn"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const principal = "p1"

// openStore starts an embedded NATS with JetStream in a temporary directory.
func openStore(t testing.TB) *jetstream.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := jetstream.Open(ctx, jetstream.Config{DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("jetstream.Open() = %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// agentFunc is a scripted agent.
type agentFunc func(ctx context.Context, emit func([]byte) error) error

func (f agentFunc) Run(ctx context.Context, _ *protocol.RunAgentInput, emit func([]byte) error) error {
	return f(ctx, emit)
}

// emitAll emits events (JSON strings) and stops at the first refusal.
func emitAll(emit func([]byte) error, events ...string) error {
	for _, e := range events {
		if err := emit([]byte(e)); err != nil {
			return err
		}
	}
	return nil
}

// sink records delivered frames.
type sink struct {
	mu     sync.Mutex
	frames []string
	notify chan struct{}
}

func newSink() *sink { return &sink{notify: make(chan struct{}, 1)} }

// Deliver records the event as a socket frames it: an envelope, or the bare event.
func (s *sink) Deliver(offset string, event []byte, _ time.Time) {
	frame := event
	if offset != "" {
		frame = protocol.AppendEnvelope(nil, offset, event)
	}
	s.mu.Lock()
	s.frames = append(s.frames, string(frame))
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

func (s *sink) snapshot() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.frames...)
}

// waitFor waits until the sink holds n frames.
func (s *sink) waitFor(t testing.TB, n int) []string {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		if f := s.snapshot(); len(f) >= n {
			return f
		}
		select {
		case <-s.notify:
		case <-deadline:
			t.Fatalf("sink holds %d frames after 10s, want %d: %v", len(s.snapshot()), n, s.snapshot())
		}
	}
}

type envelope struct {
	ID    string          `json:"id"`
	Chunk json.RawMessage `json:"chunk"`
}

type event struct {
	Type    string `json:"type"`
	Name    string `json:"name"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// parseEnvelopes decodes envelopes and returns their offsets and events.
func parseEnvelopes(t testing.TB, frames []string) (ids []string, events []event) {
	t.Helper()
	for _, f := range frames {
		var env envelope
		if err := json.Unmarshal([]byte(f), &env); err != nil || env.ID == "" || env.Chunk == nil {
			t.Fatalf("frame %s is not an envelope (%v)", f, err)
		}
		var ev event
		if err := json.Unmarshal(env.Chunk, &ev); err != nil {
			t.Fatalf("chunk %s: %v", env.Chunk, err)
		}
		ids = append(ids, env.ID)
		events = append(events, ev)
	}
	return ids, events
}

// readLog returns the whole log of runID as envelopes, once it is closed.
func readLog(t testing.TB, s *jetstream.Store, runID string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := s.Read(ctx, principal, runID, jetstream.FromStart)
	if err != nil {
		t.Fatalf("Read(%s, -1) = %v", runID, err)
	}
	defer r.Close()
	var out []string
	for {
		e, err := r.Next(ctx)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("Next() = %v after %d entries", err, len(out))
		}
		out = append(out, string(protocol.AppendEnvelope(nil, e.Offset, e.Event)))
	}
}

func input(t testing.TB, runID string) *protocol.RunAgentInput {
	t.Helper()
	in, err := protocol.DecodeRunAgentInput([]byte(fmt.Sprintf(`{"threadId":"t1","runId":%q,"messages":[]}`, runID)))
	if err != nil {
		t.Fatalf("DecodeRunAgentInput() = %v", err)
	}
	return in
}

const (
	started  = `{"type":"RUN_STARTED","threadId":"t1","runId":"r"}`
	finished = `{"type":"RUN_FINISHED","threadId":"t1","runId":"r"}`
	msgStart = `{"type":"TEXT_MESSAGE_START","messageId":"m1","role":"assistant"}`
	content  = `{"type":"TEXT_MESSAGE_CONTENT","messageId":"m1","delta":"hi"}`
	msgEnd   = `{"type":"TEXT_MESSAGE_END","messageId":"m1"}`
	chunk    = `{"type":"TEXT_MESSAGE_CHUNK","messageId":"m9","delta":"x"}`
)

// typesOf renders events as TYPE or TYPE:code for RUN_ERROR and TYPE:name for CUSTOM.
func typesOf(events []event) string {
	var b strings.Builder
	for i, e := range events {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(e.Type)
		switch e.Type {
		case "RUN_ERROR":
			b.WriteString(":" + e.Code)
		case "CUSTOM":
			b.WriteString(":" + e.Name)
		}
	}
	return b.String()
}

func TestTurn(t *testing.T) {
	store := openStore(t)
	tests := []struct {
		name    string
		agent   agentFunc
		want    string // event types in the log and, identically, at the sink
		outcome metrics.Outcome
		message string // of the final RUN_ERROR, when not empty
	}{
		{"complete", func(ctx context.Context, emit func([]byte) error) error {
			return emitAll(emit, started, msgStart, content, msgEnd, finished)
		}, "CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED",
			metrics.OutcomeCompleted, ""},
		{"agent loop with several RUN_FINISHED", func(ctx context.Context, emit func([]byte) error) error {
			return emitAll(emit, started, finished, started, msgStart, content, msgEnd, finished, started, finished)
		}, "CUSTOM:run.accepted RUN_STARTED RUN_FINISHED RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED RUN_STARTED RUN_FINISHED",
			metrics.OutcomeCompleted, ""},
		{"chunks expanded", func(ctx context.Context, emit func([]byte) error) error {
			return emitAll(emit, started, chunk, chunk, finished)
		}, "CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED",
			metrics.OutcomeCompleted, ""},
		{"missing terminal", func(ctx context.Context, emit func([]byte) error) error {
			return emitAll(emit, started, chunk)
		}, "CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_ERROR:incomplete",
			metrics.OutcomeIncomplete, turn.MsgIncomplete},
		{"agent error", func(ctx context.Context, emit func([]byte) error) error {
			if err := emitAll(emit, started, msgStart); err != nil {
				return err
			}
			return errors.New("model unreachable")
		}, "CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START RUN_ERROR:agent_error",
			metrics.OutcomeAgentError, "model unreachable"},
		{"agent error after its own RUN_ERROR", func(ctx context.Context, emit func([]byte) error) error {
			if err := emitAll(emit, started, `{"type":"RUN_ERROR","message":"quota"}`); err != nil {
				return err
			}
			return errors.New("model unreachable")
		}, "CUSTOM:run.accepted RUN_STARTED RUN_ERROR:",
			metrics.OutcomeAgentError, "quota"},
		{"protocol violation", func(ctx context.Context, emit func([]byte) error) error {
			err := emitAll(emit, started, content, finished)
			if !errors.Is(err, turn.ErrViolation) {
				return fmt.Errorf("emit = %v, want ErrViolation", err)
			}
			return err
		}, "CUSTOM:run.accepted RUN_STARTED RUN_ERROR:protocol_violation",
			metrics.OutcomeProtocolViolation, ""},
		{"empty stream", func(ctx context.Context, emit func([]byte) error) error { return nil },
			"CUSTOM:run.accepted RUN_ERROR:incomplete", metrics.OutcomeIncomplete, turn.MsgIncomplete},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runID := fmt.Sprintf("turn-%d", i)
			ctx := context.Background()
			w, err := store.Create(ctx, principal, runID, "t1")
			if err != nil {
				t.Fatalf("Create() = %v", err)
			}
			sk := newSink()
			tr, err := turn.Start(turn.Config{Input: input(t, runID), Agent: tt.agent, Log: w, Sink: sk})
			if err != nil {
				t.Fatalf("Start() = %v", err)
			}
			if err := tr.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if got := tr.Outcome(); got != tt.outcome {
				t.Errorf("Outcome() = %s, want %s", got, tt.outcome)
			}
			logged := readLog(t, store, runID)
			delivered := sk.snapshot()
			if strings.Join(delivered, "\n") != strings.Join(logged, "\n") {
				t.Errorf("delivered:\n%s\nwant the log:\n%s", strings.Join(delivered, "\n"), strings.Join(logged, "\n"))
			}
			ids, events := parseEnvelopes(t, logged)
			if got := typesOf(events); got != tt.want {
				t.Errorf("log = %s\nwant  %s", got, tt.want)
			}
			seen := map[string]bool{}
			for _, id := range ids {
				if seen[id] {
					t.Errorf("offset %s twice", id)
				}
				seen[id] = true
			}
			last := events[len(events)-1]
			if tt.message != "" && last.Message != tt.message {
				t.Errorf("final message = %q, want %q", last.Message, tt.message)
			}
			if tt.outcome == metrics.OutcomeProtocolViolation && last.Message == "" {
				t.Errorf("protocol_violation RUN_ERROR without the verifier's message")
			}
		})
	}
}

// blockingAgent emits RUN_STARTED, signals started, and waits for its context.
func blockingAgent(startedCh chan<- struct{}) agentFunc {
	return func(ctx context.Context, emit func([]byte) error) error {
		if err := emitAll(emit, started, msgStart); err != nil {
			return err
		}
		close(startedCh)
		<-ctx.Done()
		return ctx.Err()
	}
}

func TestStop(t *testing.T) {
	store := openStore(t)
	tests := []struct {
		name    string
		stop    func(*turn.Turn)
		code    string
		message string
		live    bool // the RUN_ERROR is delivered live
	}{
		{"abort", (*turn.Turn).Abort, turn.CodeAborted, turn.MsgAborted, false},
		{"interrupt", (*turn.Turn).Interrupt, turn.CodeInterrupted, turn.MsgInterrupted, true},
		{"shutdown", (*turn.Turn).Shutdown, turn.CodeShutdown, turn.MsgShutdown, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runID := "stop-" + tt.name
			ctx := context.Background()
			w, err := store.Create(ctx, principal, runID, "t1")
			if err != nil {
				t.Fatalf("Create() = %v", err)
			}
			sk := newSink()
			startedCh := make(chan struct{})
			tr, err := turn.Start(turn.Config{Input: input(t, runID), Agent: blockingAgent(startedCh), Log: w, Sink: sk})
			if err != nil {
				t.Fatalf("Start() = %v", err)
			}
			<-startedCh
			sk.waitFor(t, 3) // marker, RUN_STARTED, TEXT_MESSAGE_START
			tt.stop(tr)
			tr.Wait(ctx)
			_, events := parseEnvelopes(t, readLog(t, store, runID))
			want := "CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START RUN_ERROR:" + tt.code
			if got := typesOf(events); got != want {
				t.Fatalf("log = %s, want %s", got, want)
			}
			if m := events[len(events)-1].Message; m != tt.message {
				t.Errorf("message = %q, want %q", m, tt.message)
			}
			wantLive := 3
			if tt.live {
				wantLive = 4
			}
			if got := sk.snapshot(); len(got) != wantLive {
				t.Errorf("delivered %d frames, want %d: %v", len(got), wantLive, got)
			}
		})
	}
}

// A turn whose abort came before its run frame stores the marker and RUN_ERROR aborted, and
// neither runs its agent nor delivers anything live, however quick the agent would be.
func TestStartAborted(t *testing.T) {
	store := openStore(t)
	ctx := context.Background()
	w, err := store.Create(ctx, principal, "aborted-early", "t1")
	if err != nil {
		t.Fatalf("Create() = %v", err)
	}
	sk := newSink()
	var ran atomic.Bool
	agent := agentFunc(func(ctx context.Context, emit func([]byte) error) error {
		ran.Store(true)
		return emitAll(emit, `{"type":"RUN_STARTED","threadId":"t1","runId":"aborted-early"}`,
			`{"type":"RUN_FINISHED","threadId":"t1","runId":"aborted-early"}`)
	})
	tr, err := turn.Start(turn.Config{Input: input(t, "aborted-early"), Agent: agent, Log: w, Sink: sk, Aborted: true})
	if err != nil {
		t.Fatalf("Start() = %v", err)
	}
	tr.Wait(ctx)
	_, events := parseEnvelopes(t, readLog(t, store, "aborted-early"))
	if got, want := typesOf(events), "CUSTOM:run.accepted RUN_ERROR:"+turn.CodeAborted; got != want {
		t.Errorf("log = %s, want %s", got, want)
	}
	if ran.Load() {
		t.Error("the agent ran")
	}
	if got := sk.snapshot(); len(got) != 0 {
		t.Errorf("delivered %v, want nothing", got)
	}
}

func TestDetachedTurnCompletesIntoLog(t *testing.T) {
	store := openStore(t)
	ctx := context.Background()
	w, err := store.Create(ctx, principal, "detached", "t1")
	if err != nil {
		t.Fatalf("Create() = %v", err)
	}
	sk := newSink()
	release := make(chan struct{})
	agent := agentFunc(func(ctx context.Context, emit func([]byte) error) error {
		if err := emitAll(emit, started); err != nil {
			return err
		}
		<-release
		return emitAll(emit, msgStart, content, msgEnd, finished)
	})
	tr, err := turn.Start(turn.Config{Input: input(t, "detached"), Agent: agent, Log: w, Sink: sk})
	if err != nil {
		t.Fatalf("Start() = %v", err)
	}
	sk.waitFor(t, 2)
	tr.Detach() // the socket went away
	close(release)
	tr.Wait(ctx)
	if got := len(sk.snapshot()); got != 2 {
		t.Errorf("delivered %d frames after Detach, want 2", got)
	}
	_, events := parseEnvelopes(t, readLog(t, store, "detached"))
	if got, want := typesOf(events), "CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED"; got != want {
		t.Errorf("log = %s, want %s", got, want)
	}
}

// brokenLog refuses every append, as a log whose NATS is gone does.
type brokenLog struct {
	lost   chan struct{}
	closed bool
}

func (l *brokenLog) Append(_ []byte, stored func(string, error)) {
	go stored("", errors.New("append: nats: connection closed"))
}
func (l *brokenLog) Close(context.Context) error { l.closed = true; return nil }
func (l *brokenLog) Lost() <-chan struct{}       { return l.lost }

func TestLogFailure(t *testing.T) {
	l := &brokenLog{lost: make(chan struct{})}
	sk := newSink()
	called := make(chan struct{})
	agent := agentFunc(func(ctx context.Context, emit func([]byte) error) error {
		close(called)
		return nil
	})
	// OnLost is for a run the client can resume; one whose marker was never stored is not.
	onLost := false
	tr, err := turn.Start(turn.Config{Input: input(t, "broken"), Agent: agent, Log: l, Sink: sk, OnLost: func() { onLost = true }})
	if err != nil {
		t.Fatalf("Start() = %v", err)
	}
	tr.Wait(context.Background())
	if onLost {
		t.Error("OnLost was called for a run whose marker was never stored")
	}
	if got := tr.Outcome(); got != metrics.OutcomeLogFailed {
		t.Errorf("Outcome() = %s, want %s", got, metrics.OutcomeLogFailed)
	}
	select {
	case <-called:
		t.Error("the agent ran although run.accepted was never stored")
	default:
	}
	frames := sk.snapshot()
	if len(frames) != 1 {
		t.Fatalf("delivered %v, want one bare RUN_ERROR", frames)
	}
	var ev event
	if err := json.Unmarshal([]byte(frames[0]), &ev); err != nil || ev.Type != "RUN_ERROR" || ev.Code != turn.CodeLogUnavailable {
		t.Errorf("delivered %s, want a bare RUN_ERROR with code %s", frames[0], turn.CodeLogUnavailable)
	}
	if !l.closed {
		t.Error("the log was not closed")
	}
}

func TestStartRequiresConfig(t *testing.T) {
	if _, err := turn.Start(turn.Config{}); !errors.Is(err, turn.ErrConfig) {
		t.Errorf("Start(Config{}) = %v, want ErrConfig", err)
	}
}

// failingAfter stores its first n appends, in order, then refuses every append, as a writer
// that lost its connection mid-turn does.
type failingAfter struct {
	mu sync.Mutex
	n  int
}

func (l *failingAfter) Append(_ []byte, stored func(string, error)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == 0 {
		go stored("", errors.New("append: nats: connection closed"))
		return
	}
	l.n--
	off := fmt.Sprintf("o%d", l.n)
	go stored(off, nil)
}
func (l *failingAfter) Close(context.Context) error { return nil }
func (l *failingAfter) Lost() <-chan struct{}       { return nil }

// TestLogFailureMidTurn: a log that fails after its marker was stored ends the turn; the
// client is told so with a bare RUN_ERROR log_unavailable, or, where the caller set OnLost (a
// conversation socket, closed to be resumed elsewhere: the run's end is written by a takeover
// or a reaper), OnLost is called once instead and nothing more is sent.
func TestLogFailureMidTurn(t *testing.T) {
	for _, withOnLost := range []bool{false, true} {
		t.Run(fmt.Sprintf("OnLost set %v", withOnLost), func(t *testing.T) {
			// The stored callbacks must come in order: serialise them through one goroutine.
			l := &orderedLog{inner: &failingAfter{n: 3}}
			sk := newSink()
			agent := agentFunc(func(ctx context.Context, emit func([]byte) error) error {
				if err := emitAll(emit, started, msgStart); err != nil {
					return err
				}
				// Keep emitting until the turn stops the agent.
				for ctx.Err() == nil {
					if err := emit([]byte(content)); err != nil {
						return err
					}
					time.Sleep(time.Millisecond)
				}
				return ctx.Err()
			})
			lost := 0
			cfg := turn.Config{Input: input(t, "mid"), Agent: agent, Log: l, Sink: sk}
			if withOnLost {
				cfg.OnLost = func() { lost++ }
			}
			tr, err := turn.Start(cfg)
			if err != nil {
				t.Fatalf("Start() = %v", err)
			}
			tr.Wait(context.Background())
			if got := tr.Outcome(); got != metrics.OutcomeLogFailed {
				t.Errorf("Outcome() = %s, want %s", got, metrics.OutcomeLogFailed)
			}
			frames := sk.snapshot()
			want, what := 4, "the 3 stored envelopes and a bare RUN_ERROR"
			if withOnLost {
				want, what = 3, "the 3 stored envelopes"
				if lost != 1 {
					t.Errorf("OnLost called %d times, want once", lost)
				}
			}
			if len(frames) != want {
				t.Fatalf("delivered %d frames, want %s: %v", len(frames), what, frames)
			}
			_, events := parseEnvelopes(t, frames[:3])
			if got, want := typesOf(events), "CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START"; got != want {
				t.Errorf("stored envelopes = %s, want %s", got, want)
			}
			if withOnLost {
				return
			}
			var ev event
			if err := json.Unmarshal([]byte(frames[3]), &ev); err != nil || ev.Type != "RUN_ERROR" || ev.Code != turn.CodeLogUnavailable {
				t.Errorf("last frame %s, want a bare RUN_ERROR with code %s", frames[3], turn.CodeLogUnavailable)
			}
		})
	}
}

// orderedLog runs a Log's stored callbacks one at a time, in append order.
type orderedLog struct {
	inner turn.Log
	mu    sync.Mutex
	tail  chan struct{}
}

func (l *orderedLog) Append(event []byte, stored func(string, error)) {
	l.mu.Lock()
	prev := l.tail
	next := make(chan struct{})
	l.tail = next
	l.mu.Unlock()
	l.inner.Append(event, func(off string, err error) {
		if prev != nil {
			<-prev
		}
		stored(off, err)
		close(next)
	})
}
func (l *orderedLog) Close(ctx context.Context) error { return l.inner.Close(ctx) }
func (l *orderedLog) Lost() <-chan struct{}           { return l.inner.Lost() }

// TestAgentContext: the agent's context carries Config.Context's values (e.g. the client's
// headers) but not its cancellation: the turn, not the request that started it, decides when
// the agent stops.
func TestAgentContext(t *testing.T) {
	store := openStore(t)
	w, err := store.Create(context.Background(), principal, "ctx-values", "t1")
	if err != nil {
		t.Fatal(err)
	}
	type key struct{}
	values, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "tag-1"))
	cancel() // a request that has ended
	var got any
	var ctxErr error
	tr, err := turn.Start(turn.Config{Input: input(t, "ctx-values"), Log: w, Context: values,
		Agent: agentFunc(func(ctx context.Context, emit func([]byte) error) error {
			got, ctxErr = ctx.Value(key{}), ctx.Err()
			return emitAll(emit, started, finished)
		})})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got != "tag-1" || ctxErr != nil {
		t.Errorf("agent context: value %v, err %v; want tag-1, <nil>", got, ctxErr)
	}
	if o := tr.Outcome(); o != metrics.OutcomeCompleted {
		t.Errorf("Outcome() = %s, want %s", o, metrics.OutcomeCompleted)
	}
}

// TestAgentIgnoringCancellation: an agent that never returns once cancelled does not hold its
// turn: the turn ends within AgentStopTimeout with the code of its stop, the log closed, and
// the agent's later emits are refused.
func TestAgentIgnoringCancellation(t *testing.T) {
	store := openStore(t)
	ctx := context.Background()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	emitted := make(chan error, 1)
	startedCh := make(chan struct{})
	agent := agentFunc(func(ctx context.Context, emit func([]byte) error) error {
		if err := emitAll(emit, started, msgStart); err != nil {
			return err
		}
		close(startedCh)
		<-release // ignores ctx
		emitted <- emit([]byte(`{"type":"TEXT_MESSAGE_END","messageId":"m1"}`))
		return nil
	})
	const runID = "stubborn"
	w, err := store.Create(ctx, principal, runID, "t1")
	if err != nil {
		t.Fatalf("Create() = %v", err)
	}
	tr, err := turn.Start(turn.Config{Input: input(t, runID), Agent: agent, Log: w, AgentStopTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatalf("Start() = %v", err)
	}
	<-startedCh
	tr.Abort()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := tr.Wait(wctx); err != nil {
		t.Fatalf("Wait() after Abort = %v: an agent ignoring its context holds the turn", err)
	}
	_, events := parseEnvelopes(t, readLog(t, store, runID))
	if got, want := typesOf(events), "CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START RUN_ERROR:"+turn.CodeAborted; got != want {
		t.Fatalf("log = %s, want %s", got, want)
	}
	if tr.Outcome() != metrics.OutcomeAborted {
		t.Errorf("Outcome() = %v, want %v", tr.Outcome(), metrics.OutcomeAborted)
	}
	release <- struct{}{}
	if err := <-emitted; !errors.Is(err, turn.ErrStopped) {
		t.Errorf("emit after the turn ended = %v, want ErrStopped", err)
	}
}

// TestLatencyExemplarTraceID: the latency a turn observes carries, as its exemplar, the runId
// and the trace id of the span context in the turn's Config.Context, the context the agent
// runs in.
func TestLatencyExemplarTraceID(t *testing.T) {
	store := openStore(t)
	const runID = "traced"
	w, err := store.Create(context.Background(), principal, runID, "t1")
	if err != nil {
		t.Fatal(err)
	}
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	m.SetAgent("test", "")
	var agentTrace trace.TraceID
	tr, err := turn.Start(turn.Config{Input: input(t, runID), Log: w, Context: ctx, Metrics: m,
		Agent: agentFunc(func(ctx context.Context, emit func([]byte) error) error {
			agentTrace = trace.SpanContextFromContext(ctx).TraceID()
			return emitAll(emit, started, msgStart, content, content, msgEnd, finished)
		})})
	if err != nil {
		t.Fatal(err)
	}
	tr.Wait(context.Background())
	if agentTrace != tid {
		t.Errorf("the agent's context has trace %s, want %s", agentTrace, tid)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "wsgateway_agent_") || f.GetType() != dto.MetricType_HISTOGRAM {
			continue
		}
		for _, mm := range f.GetMetric() {
			for _, b := range mm.GetHistogram().GetBucket() {
				ex := b.GetExemplar()
				if ex == nil {
					continue
				}
				labels := map[string]string{}
				for _, l := range ex.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["trace_id"] != tid.String() || labels["run_id"] != runID {
					t.Errorf("%s: exemplar %v, want trace_id %s and run_id %s", f.GetName(), labels, tid, runID)
				}
				seen[f.GetName()] = true
			}
		}
	}
	for _, name := range []string{"time_to_first_token_seconds", "inter_token_seconds", "tokens_per_second", "turn_duration_seconds"} {
		if !seen["wsgateway_agent_"+name] {
			t.Errorf("wsgateway_agent_%s has no exemplar", name)
		}
	}
}

// recordThread is a turn.Thread that holds the run's acceptance until accept is closed, and
// records what the turn handed it.
type recordThread struct {
	accept chan struct{}
	sk     *sink // the turn's sink: what it held when each call came

	mu        sync.Mutex
	kept      []string
	terminals []int // the indexes in kept of the events Keep was told are terminals
	closed    int
	closeErr  error
	atClose   int // frames delivered when Closed came
}

func (r *recordThread) Accepted() <-chan struct{} { return r.accept }

func (r *recordThread) Keep(event []byte, terminal bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kept = append(r.kept, string(event))
	if terminal {
		r.terminals = append(r.terminals, len(r.kept)-1)
	}
}

func (r *recordThread) Closed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed++
	r.closeErr = err
	r.atClose = len(r.sk.snapshot())
}

// TestThreadStep: a turn with a Thread keeps it in step with the log: the marker is stored
// while the run's thread is written, and delivered only once both are done (nothing of the
// run reaches the sink before its thread knows it); every event appended reaches Keep, in the
// log's order; Closed comes once, after the log is closed, with the close's result.
func TestThreadStep(t *testing.T) {
	store := openStore(t)
	ctx := context.Background()
	w, err := store.Create(ctx, principal, "threaded", "t1")
	if err != nil {
		t.Fatalf("Create() = %v", err)
	}
	sk := newSink()
	th := &recordThread{accept: make(chan struct{}), sk: sk}
	agent := agentFunc(func(ctx context.Context, emit func([]byte) error) error {
		return emitAll(emit, started, msgStart, content, msgEnd, finished)
	})
	tr, err := turn.Start(turn.Config{Input: input(t, "threaded"), Agent: agent, Log: w, Thread: th, Sink: sk})
	if err != nil {
		t.Fatalf("Start() = %v", err)
	}
	// The marker is stored at once; it waits for the thread.
	deadline := time.Now().Add(10 * time.Second)
	for entries, _, _ := store.Snapshot(ctx, principal, "threaded"); len(entries) == 0; entries, _, _ = store.Snapshot(ctx, principal, "threaded") {
		if time.Now().After(deadline) {
			t.Fatal("the marker was not stored while the thread's write was pending")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if got := sk.snapshot(); len(got) != 0 {
		t.Fatalf("delivered %d frames before the run was in its thread, want none: %v", len(got), got)
	}
	close(th.accept)
	tr.Wait(ctx)
	frames := sk.snapshot()
	_, delivered := parseEnvelopes(t, frames)
	want := "CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED"
	if got := typesOf(delivered); got != want {
		t.Errorf("delivered %s, want %s", got, want)
	}
	_, stored := parseEnvelopes(t, readLog(t, store, "threaded"))
	th.mu.Lock()
	defer th.mu.Unlock()
	var kept []event
	for _, e := range th.kept {
		var ev event
		if err := json.Unmarshal([]byte(e), &ev); err != nil {
			t.Fatal(err)
		}
		kept = append(kept, ev)
	}
	if got, want := typesOf(kept), typesOf(stored); got != want {
		t.Errorf("kept %s, want what the log stored, %s", got, want)
	}
	if want := []int{len(kept) - 1}; !slices.Equal(th.terminals, want) {
		t.Errorf("Keep told the events %v are terminals, want %v (RUN_FINISHED)", th.terminals, want)
	}
	if th.closed != 1 || th.closeErr != nil || th.atClose != len(frames) {
		t.Errorf("Closed %d times (err %v, after %d of %d frames), want once, nil, after every frame", th.closed, th.closeErr, th.atClose, len(frames))
	}
}

// TestQueued: a turn whose Config.Queued answers a Queue stores its event after the marker and
// calls the agent only once the Queue's Wait returns; aborted while it waits, it ends
// RUN_ERROR aborted without calling the agent, and its Wait's context ends.
func TestQueued(t *testing.T) {
	store := openStore(t)
	ctx := context.Background()
	for _, abort := range []bool{false, true} {
		runID := fmt.Sprintf("queued-%v", abort)
		w, err := store.Create(ctx, principal, runID, "t1")
		if err != nil {
			t.Fatalf("Create() = %v", err)
		}
		var ran atomic.Bool
		agent := agentFunc(func(ctx context.Context, emit func([]byte) error) error {
			ran.Store(true)
			return emitAll(emit, started, finished)
		})
		waiting, release := make(chan struct{}), make(chan struct{})
		var waitErr atomic.Value
		q := &turn.Queue{Event: protocol.RunQueued(2), Wait: func(ctx context.Context) error {
			close(waiting)
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				waitErr.Store(ctx.Err())
				return ctx.Err()
			}
		}}
		sk := newSink()
		tr, err := turn.Start(turn.Config{Input: input(t, runID), Agent: agent, Log: w, Sink: sk, Queued: func() *turn.Queue { return q }})
		if err != nil {
			t.Fatalf("Start() = %v", err)
		}
		<-waiting
		sk.waitFor(t, 2) // the marker and run.queued, while the run waits
		if ran.Load() {
			t.Fatal("the agent ran while the run was queued")
		}
		want := "CUSTOM:run.accepted CUSTOM:run.queued RUN_STARTED RUN_FINISHED"
		if abort {
			tr.Abort()
			want = "CUSTOM:run.accepted CUSTOM:run.queued RUN_ERROR:" + turn.CodeAborted
		} else {
			close(release)
		}
		tr.Wait(ctx)
		_, events := parseEnvelopes(t, readLog(t, store, runID))
		if got := typesOf(events); got != want {
			t.Errorf("abort %v: log = %s, want %s", abort, got, want)
		}
		if abort && (ran.Load() || waitErr.Load() == nil) {
			t.Errorf("aborted while queued: the agent ran %v, the wait's context ended %v", ran.Load(), waitErr.Load() != nil)
		}
	}
}
