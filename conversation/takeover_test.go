package conversation_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/wsgateway/wsgateway/conversation"
	"github.com/wsgateway/wsgateway/internal/tcpproxy"
	"github.com/wsgateway/wsgateway/internal/tracing"
	"github.com/wsgateway/wsgateway/protocol"
)

// deltaTexts returns the text deltas of frames, in order.
func deltaTexts(frames []frame) []string {
	var out []string
	for _, f := range frames {
		if f.Type != protocol.TextMessageContent {
			continue
		}
		var ev struct{ Delta string }
		json.Unmarshal(f.Event, &ev)
		out = append(out, ev.Delta)
	}
	return out
}

// wantDeltas returns testAgent's text deltas of a turn of n tokens.
func wantDeltas(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "t%d ", i)
	}
	return b.String()
}

// wholeTurn checks that frames are testAgent's whole turn of tokens deltas, each event once.
func wholeTurn(t *testing.T, what string, frames []frame, tokens int) {
	t.Helper()
	if s := summary(frames); s != tokenTurn(tokens) {
		t.Errorf("%s = %s, want %s", what, s, tokenTurn(tokens))
	}
	if d := strings.Join(deltaTexts(frames), ""); d != wantDeltas(tokens) {
		t.Errorf("%s: deltas %q, want %q", what, d, wantDeltas(tokens))
	}
}

// killedMidTurn starts a turn of tokens deltas on b, reads its first frames, then closes b's
// store as a dead gateway's process would leave it (no more writes, its liveness gone), and
// returns what the client had.
func killedMidTurn(t *testing.T, b *env, runID string, tokens int) []frame {
	t.Helper()
	cl := dial(t, b.url(), "")
	cl.send(runFrame(runID, script{Tokens: tokens, IntervalMs: 20}))
	got := cl.untilN(t, 3+tokens/4) // run.accepted, RUN_STARTED, TEXT_MESSAGE_START, deltas
	b.store.Close()
	return got
}

// TestTakeover: the turn of a gateway that died goes on on another gateway sharing the
// store: a client that resumes there by offset gets the rest, every delta once and in
// order, then RUN_FINISHED; the whole log holds each event once and one terminal.
func TestTakeover(t *testing.T) {
	a := newEnv(t, envOptions{replay: true, leaseTTL: time.Second})
	b := newEnv(t, envOptions{natsURL: a.store.ClientURL(), replay: true, leaseTTL: time.Second})
	const tokens = 40
	got := killedMidTurn(t, b, "taken", tokens)
	rest, end := a.resume(t, "taken", got[len(got)-1].Offset)
	if end.err != nil && end.code != 1000 {
		t.Fatalf("resume on the live gateway ended %v (%d)", end.err, end.code)
	}
	wholeTurn(t, "the client's turn across the takeover", append(got, rest...), tokens)
	whole, _ := a.resume(t, "taken", "-1")
	wholeTurn(t, "the whole log", whole, tokens)
	a.waitMetric(t, "wsgateway_jetstream_takeovers_total", "continued", 1)
	info, err := a.store.Run(context.Background(), "p1", "taken")
	if err != nil || info.Takeovers != 1 || info.Reaped {
		t.Errorf("the run's metadata = %+v, %v; want taken over once, not reaped", info, err)
	}
}

// divergent is testAgent with other words: a replay that disagrees with the log.
type divergent struct{ testAgent }

func (d divergent) Run(ctx context.Context, in *protocol.RunAgentInput, emit func([]byte) error) error {
	return d.testAgent.Run(ctx, in, func(ev []byte) error {
		return emit([]byte(strings.ReplaceAll(string(ev), `"delta":"t`, `"delta":"other `)))
	})
}

// TestTakeoverDiverged: a replay that disagrees with the stored log inside its stored part
// ends the run RUN_ERROR replay_diverged; nothing of the replay's divergent part is
// appended, and the log holds the stored part once.
func TestTakeoverDiverged(t *testing.T) {
	a := newEnv(t, envOptions{replay: true, leaseTTL: time.Second, agent: divergent{}})
	b := newEnv(t, envOptions{natsURL: a.store.ClientURL(), replay: true, leaseTTL: time.Second})
	const tokens = 40
	got := killedMidTurn(t, b, "diverged", tokens)
	whole, _ := a.resume(t, "diverged", "-1")
	if len(whole) == 0 {
		t.Fatal("the log is empty")
	}
	last := whole[len(whole)-1]
	var ev struct{ Code string }
	json.Unmarshal(last.Event, &ev)
	if last.Type != protocol.RunError || ev.Code != "replay_diverged" {
		t.Errorf("the log ends %s, want RUN_ERROR replay_diverged", last.raw)
	}
	for _, d := range deltaTexts(whole) {
		if strings.HasPrefix(d, "other") {
			t.Errorf("the divergent replay's delta %q was appended", d)
		}
	}
	stored := deltaTexts(whole)
	if !strings.HasPrefix(wantDeltas(tokens), strings.Join(stored, "")) || len(stored) < len(deltaTexts(got)) {
		t.Errorf("the log's deltas = %q, want the stored prefix (at least %d) once", stored, len(deltaTexts(got)))
	}
	a.waitMetric(t, "wsgateway_jetstream_takeovers_total", "diverged", 1)
}

// TestNoTakeoverWithoutReplay: a gateway whose agent does not replay (Config.Replay false)
// keeps no input, and its dead runs end RUN_ERROR producer_lost as before, even where a live
// gateway would take them over.
func TestNoTakeoverWithoutReplay(t *testing.T) {
	a := newEnv(t, envOptions{replay: true, leaseTTL: time.Second})
	b := newEnv(t, envOptions{natsURL: a.store.ClientURL(), leaseTTL: time.Second})
	killedMidTurn(t, b, "reaped", 40)
	whole, _ := a.resume(t, "reaped", "-1")
	last := whole[len(whole)-1]
	var ev struct{ Code string }
	json.Unmarshal(last.Event, &ev)
	if last.Type != protocol.RunError || ev.Code != "producer_lost" {
		t.Errorf("the log ends %s, want RUN_ERROR producer_lost", last.raw)
	}
}

// TestTakeoverOfACutGateway: a gateway cut from NATS (its connection stalled, not closed)
// while its turn streams loses the run to a live gateway, which takes it over; once the cut
// heals, nothing the cut gateway tried to write is in the log, and its socket is closed 1012
// "run moved", after which the client resumes on the other gateway by its last offset and
// gets the rest, each delta once.
func TestTakeoverOfACutGateway(t *testing.T) {
	a := newEnv(t, envOptions{replay: true, leaseTTL: time.Second})
	px := tcpproxy.Start(t, strings.TrimPrefix(a.store.ClientURL(), "nats://"), nil)
	b := newEnv(t, envOptions{natsURL: "nats://" + px.Addr(), replay: true, leaseTTL: time.Second})
	const tokens = 60
	cl := dial(t, b.url(), "")
	cl.send(runFrame("cut", script{Tokens: tokens, IntervalMs: 20}))
	got := cl.untilN(t, 3+10)
	px.Stall()
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := a.store.Run(context.Background(), "p1", "cut")
		if err == nil && info.Takeovers == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run of the cut gateway was not taken over in 30s: %+v, %v", info, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	px.Resume()
	// The cut gateway learns it lost the run: the client gets what was queued, then the close.
	for {
		f := cl.next(30 * time.Second)
		if f.err != nil {
			if f.code != websocket.StatusServiceRestart || f.reason != "run moved" {
				t.Fatalf("the cut gateway's socket ended %d %q (%v), want 1012 run moved", f.code, f.reason, f.err)
			}
			break
		}
		got = append(got, f)
	}
	rest, _ := a.resume(t, "cut", got[len(got)-1].Offset)
	wholeTurn(t, "the client's turn across the cut", append(got, rest...), tokens)
	whole, _ := a.resume(t, "cut", "-1")
	wholeTurn(t, "the whole log (nothing of the cut gateway's writes)", whole, tokens)
}

// TestTakeoverAborted: a run of a dead gateway is stopped from the live one (POST
// /api/runs/{runId}/abort) while it is taken over, during its replay or after: the abort
// answers "aborted", and the log holds what was stored, each event once, then RUN_ERROR
// aborted.
func TestTakeoverAborted(t *testing.T) {
	a := newEnv(t, envOptions{replay: true, leaseTTL: time.Second})
	b := newEnv(t, envOptions{natsURL: a.store.ClientURL(), replay: true, leaseTTL: time.Second})
	const tokens = 200
	got := killedMidTurn(t, b, "stopped", tokens)
	resp := a.httpDo(t, http.MethodPost, "/api/runs/stopped/abort", nil, nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"outcome":"aborted"`) {
		t.Fatalf("abort of the taken-over run = %d %s, want 200 aborted", resp.StatusCode, body)
	}
	whole, _ := a.resume(t, "stopped", "-1")
	last := whole[len(whole)-1]
	var ev struct{ Code string }
	json.Unmarshal(last.Event, &ev)
	if last.Type != protocol.RunError || ev.Code != "aborted" {
		t.Errorf("the log ends %s, want RUN_ERROR aborted", last.raw)
	}
	d := strings.Join(deltaTexts(whole), "")
	if !strings.HasPrefix(wantDeltas(tokens), d) || len(deltaTexts(whole)) < len(deltaTexts(got)) {
		t.Errorf("the log's deltas = %q, want a prefix of the turn's, at least the %d the client had", d, len(deltaTexts(got)))
	}
}

// inputs is testAgent recording the messages each of its runs is given.
type inputs struct {
	testAgent
	got chan []string // "role:content" of each message of a run's input
}

func (a inputs) Run(ctx context.Context, in *protocol.RunAgentInput, emit func([]byte) error) error {
	var seen []string
	for _, m := range in.Messages {
		seen = append(seen, m.Role+":"+m.Text())
	}
	// What an upstream agent is sent (the agui agent POSTs in.JSON()) holds the same.
	if fwd, err := protocol.DecodeRunAgentInput(in.JSON()); err != nil {
		seen = append(seen, fmt.Sprintf("JSON() undecodable: %v", err))
	} else if len(fwd.Messages) != len(in.Messages) {
		seen = append(seen, fmt.Sprintf("JSON() with %d messages", len(fwd.Messages)))
	}
	select {
	case a.got <- seen:
	default:
	}
	return a.testAgent.Run(ctx, in, emit)
}

// TestTakeoverInContext: the agent of a taken-over run of a thread is given the thread's
// conversation as the first producer's agent was, though the run posted only its new message.
func TestTakeoverInContext(t *testing.T) {
	ag := inputs{got: make(chan []string, 1)}
	a := newEnv(t, envOptions{replay: true, leaseTTL: time.Second, agent: ag})
	b := newEnv(t, envOptions{natsURL: a.store.ClientURL(), replay: true, leaseTTL: time.Second})
	cl := dial(t, b.url(), "")
	cl.send(threadFrame("ctx", "first", script{Tokens: 2}, "u1", "my name is Ada"))
	cl.untilTerminal()
	cl.send(threadFrame("ctx", "second", script{Tokens: 40, IntervalMs: 20}, "u2", "what is my name?"))
	cl.untilN(t, 3+10)
	b.store.Close()
	select {
	case got := <-ag.got:
		want := []string{"user:my name is Ada", "assistant:t1 t2 ", "user:what is my name?"}
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("the taken-over run's agent was given %q, want %q", got, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the run was not taken over in 30s")
	}
}

// TestTakeoverTraced: a takeover's span is in the trace of the run's turn, a child of the
// dead gateway's turn span, with the takeover's count and the events it found stored.
func TestTakeoverTraced(t *testing.T) {
	recA, recB := tracetest.NewSpanRecorder(), tracetest.NewSpanRecorder()
	tpA := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recA))
	tpB := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recB))
	defer tpA.Shutdown(context.Background())
	defer tpB.Shutdown(context.Background())
	a := newEnv(t, envOptions{replay: true, leaseTTL: time.Second, tracer: tpA})
	b := newEnv(t, envOptions{natsURL: a.store.ClientURL(), replay: true, leaseTTL: time.Second, tracer: tpB})
	killedMidTurn(t, b, "traced", 40)
	var turnSpan trace.SpanContext
	for _, s := range recB.Started() {
		if s.Name() == tracing.SpanTurn {
			turnSpan = s.SpanContext()
		}
	}
	if !turnSpan.IsValid() {
		t.Fatal("no turn span on the gateway that died")
	}
	a.waitMetric(t, "wsgateway_jetstream_takeovers_total", "continued", 1)
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, s := range recA.Ended() {
			if s.Name() != tracing.SpanTakeover {
				continue
			}
			if s.SpanContext().TraceID() != turnSpan.TraceID() || s.Parent().SpanID() != turnSpan.SpanID() {
				t.Fatalf("the takeover span is in trace %s under %s, want the turn's %s under %s",
					s.SpanContext().TraceID(), s.Parent().SpanID(), turnSpan.TraceID(), turnSpan.SpanID())
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no takeover span ended on the live gateway")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTakeoverQueued: the gateway of a queued run (multitaskStrategy enqueue) dies. A run
// that never started is not started out of turn by a takeover: it ends RUN_ERROR
// producer_lost, and the thread's run before it goes on. A run that had started when its
// gateway died is taken over like any other: its log holds the marker, run.queued and the
// whole turn, each once.
func TestTakeoverQueued(t *testing.T) {
	a := newEnv(t, envOptions{replay: true, leaseTTL: time.Second})
	// Never started: queued on b1 behind a run streaming on a.
	b1 := newEnv(t, envOptions{natsURL: a.store.ClientURL(), replay: true, leaseTTL: time.Second, multitask: "enqueue"})
	first := dial(t, a.url(), "")
	first.send(threadFrame("T1", "first", script{Tokens: 150, IntervalMs: 20}, "u1", "first"))
	first.untilN(t, 4)
	queued := dial(t, b1.url(), "")
	queued.send(threadFrame("T1", "queued", script{Tokens: 5}, "u2", "second"))
	queued.untilN(t, 2) // run.accepted, run.queued
	b1.store.Close()
	log, end := a.resume(t, "queued", "-1")
	if got := summary(log); got != "CUSTOM:run.accepted CUSTOM:run.queued RUN_ERROR:producer_lost" || end.code != websocket.StatusNormalClosure {
		t.Errorf("the queued run of a dead gateway: %s (close %d), want it ended producer_lost, never started", got, end.code)
	}
	if got := summary(first.untilTerminal()); !strings.HasSuffix(got, "RUN_FINISHED") {
		t.Errorf("the run before it ended %s", got)
	}

	// Started: queued on b2 behind a short run, started, then b2 dies mid-turn.
	b2 := newEnv(t, envOptions{natsURL: a.store.ClientURL(), replay: true, leaseTTL: time.Second, multitask: "enqueue"})
	short := dial(t, a.url(), "")
	short.send(threadFrame("T2", "short", script{Tokens: 20, IntervalMs: 10}, "u1", "first"))
	short.untilN(t, 3)
	cl := dial(t, b2.url(), "")
	const tokens = 40
	cl.send(threadFrame("T2", "started", script{Tokens: tokens, IntervalMs: 20}, "u2", "second"))
	got := cl.untilN(t, 2+3+tokens/4) // run.accepted, run.queued, then RUN_STARTED, TEXT_MESSAGE_START, deltas
	b2.store.Close()
	rest, _ := a.resume(t, "started", got[len(got)-1].Offset)
	whole := append(got, rest...)
	if whole[1].Type != "CUSTOM" {
		t.Fatalf("the second frame is %s, want run.queued", whole[1].raw)
	}
	wholeTurn(t, "the started queued run across its takeover", append(whole[:1:1], whole[2:]...), tokens)
	log, _ = a.resume(t, "started", "-1")
	if summary(log[:2]) != "CUSTOM:run.accepted CUSTOM:run.queued" {
		t.Fatalf("the log starts %s", summary(log[:2]))
	}
	wholeTurn(t, "the whole log", append(log[:1:1], log[2:]...), tokens)
}

// neverAccepted is a gateway's Threads whose AcceptRun never lands: the gateway dies, as it
// were, before its runs reach their threads.
type neverAccepted struct{ threads }

func (neverAccepted) AcceptRun(context.Context, string, string, string, json.RawMessage, conversation.ThreadAhead, conversation.Overlap) (conversation.Thread, error) {
	return nil, errors.New("NATS is away")
}

// TestTakeoverRecordsThread: a gateway dies mid-turn before the run's acceptance reached its
// thread; the takeover records the run in the thread, so that once the run ends, a hydrate
// shows the user's message and the whole reply.
func TestTakeoverRecordsThread(t *testing.T) {
	a := newEnv(t, envOptions{replay: true, leaseTTL: time.Second})
	b := newEnv(t, envOptions{natsURL: a.store.ClientURL(), replay: true, leaseTTL: time.Second,
		wrapThreads: func(th conversation.Threads) conversation.Threads { return neverAccepted{th} }})
	cl := dial(t, b.url(), "")
	cl.send(threadFrame("T", "lost", script{Tokens: 40, IntervalMs: 20}, "u1", "hello"))
	cl.untilN(t, 3+10)
	b.store.Close()
	a.waitClosed(t, "lost")
	want := "u1 user: hello | m-lost-1 assistant: " + wantDeltas(40) + " | "
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		h := a.hydrate(t, "/api/chat", "", "threadId", "T")
		if h.ActiveRun == nil && h.summary() == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the thread of a run taken over = %s\nwant messages %s", h.raw, want)
		}
	}
}
