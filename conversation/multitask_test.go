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

	"github.com/wsgateway/wsgateway/agent/demo"
	"github.com/wsgateway/wsgateway/conversation"
	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/threadstore"
)

// withStrategy returns the run frame with its multitaskStrategy set.
func withStrategy(frame []byte, strategy string) []byte {
	var m map[string]any
	json.Unmarshal(frame, &m)
	m["multitaskStrategy"] = strategy
	b, _ := json.Marshal(m)
	return b
}

// bareError reads the next frame of cl, which must be a bare RUN_ERROR (no offset), and
// returns its code and message.
func bareError(t *testing.T, cl *client) (code, message string) {
	t.Helper()
	f := cl.next(20 * time.Second)
	var ev struct{ Code, Message string }
	json.Unmarshal(f.Event, &ev)
	if f.Type != "RUN_ERROR" || f.Kind != protocol.FrameEvent {
		t.Fatalf("want a bare RUN_ERROR, got %s", f.raw)
	}
	return ev.Code, ev.Message
}

// TestMultitaskReject (THREADS.md section 6): two gateways, one thread. While a run streams,
// a run sent with multitaskStrategy reject, through either gateway and every door, is refused
// with thread_busy (409 over HTTP, naming the active run) and leaves no log and nothing in the
// thread; a gateway whose --multitask is reject refuses a run that names no strategy; one
// sent with concurrent runs beside it; once the first run's terminal is out, a rejecting run
// starts; an unknown strategy is refused as invalid input.
func TestMultitaskReject(t *testing.T) {
	e1 := newEnv(t, envOptions{})
	e2 := newEnv(t, envOptions{natsURL: e1.store.ClientURL(), multitask: conversation.MultitaskReject})

	a := dial(t, e1.url(), "")
	a.send(threadFrame("T", "r1", script{Tokens: 60, IntervalMs: 20}, "u1", "first"))
	a.untilN(t, 4) // r1 is accepted, in its thread, and streams

	b := dial(t, e2.url(), "")
	b.send(withStrategy(threadFrame("T", "r2", script{Tokens: 1}, "u1", "first", "u2", "second"), "reject"))
	if code, msg := bareError(t, b); code != conversation.CodeThreadBusy || msg != conversation.MsgThreadBusy {
		t.Errorf("reject on the other gateway: %s %q, want %s", code, msg, conversation.CodeThreadBusy)
	}
	b.send(threadFrame("T", "r3", script{Tokens: 1}, "u1", "first", "u3", "third")) // --multitask reject
	if code, _ := bareError(t, b); code != conversation.CodeThreadBusy {
		t.Errorf("a run naming no strategy on a gateway with --multitask reject: %s, want %s", code, conversation.CodeThreadBusy)
	}
	a2 := dial(t, e1.url(), "")
	a2.send(withStrategy(threadFrame("T", "r4", script{Tokens: 1}, "u4", "fourth"), "reject"))
	if code, _ := bareError(t, a2); code != conversation.CodeThreadBusy {
		t.Errorf("reject on the active run's gateway: %s, want %s", code, conversation.CodeThreadBusy)
	}
	a2.send(withStrategy(threadFrame("T", "r5", script{Tokens: 1}, "u5", "fifth"), "sometimes"))
	if code, msg := bareError(t, a2); code != conversation.CodeInvalidInput || !strings.Contains(msg, "multitaskStrategy") {
		t.Errorf("an unknown strategy: %s %q, want %s naming multitaskStrategy", code, msg, conversation.CodeInvalidInput)
	}
	for _, door := range []struct {
		e    *env
		path string
	}{
		{e2, "/api/threads/T/runs"}, {e1, "/api/chat"}, {e2, "/agui"},
	} {
		body := withStrategy(threadFrame("T", "h-"+strings.ReplaceAll(door.path, "/", ""), script{Tokens: 1}, "uh", "over HTTP"), "reject")
		resp := door.e.httpDo(t, http.MethodPost, door.path, body, http.Header{"Accept": {"text/event-stream"}})
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := `{"error":"thread_busy","activeRun":{"runId":"r1"}}` + "\n"; resp.StatusCode != http.StatusConflict || string(got) != want {
			t.Errorf("POST %s with reject = %d %s, want 409 %s", door.path, resp.StatusCode, got, want)
		}
	}
	for _, id := range []string{"r2", "r3", "r4"} {
		if _, end := e1.resume(t, id, "-1"); end.code != conversation.StatusUnknownRun {
			t.Errorf("resume of the refused %s closed %d, want %d: a log was created", id, end.code, conversation.StatusUnknownRun)
		}
	}

	// concurrent runs beside r1, whatever the gateway's default.
	b.send(withStrategy(threadFrame("T", "r6", script{Tokens: 2}, "u6", "sixth"), "concurrent"))
	if got := summary(b.untilTerminal()); got != tokenTurn(2) {
		t.Errorf("concurrent run: %s", got)
	}
	if got := summary(a.untilTerminal()); !strings.HasSuffix(got, "RUN_FINISHED") {
		t.Fatalf("r1: %s", got)
	}
	// r1's terminal is out: a rejecting run starts at once, even before r1's finish lands
	// in the thread.
	b.send(withStrategy(threadFrame("T", "r7", script{Tokens: 2}, "u7", "seventh"), "reject"))
	if got := summary(b.untilTerminal()); got != tokenTurn(2) {
		t.Errorf("reject once the thread is idle: %s", got)
	}
	h := e2.hydrate(t, "/api/chat", "", "threadId", "T")
	for _, refused := range []string{"u2", "u3", "u4", "u5", "uh"} {
		if strings.Contains(h.summary(), refused+" user") {
			t.Errorf("the thread shows the refused message %s: %s", refused, h.summary())
		}
	}
	for _, kept := range []string{"u1 user", "u6 user", "u7 user", "m-r7-1 assistant"} {
		if !strings.Contains(h.summary(), kept) {
			t.Errorf("the thread lacks %s: %s", kept, h.summary())
		}
	}
}

// TestMultitaskEnqueue (THREADS.md section 6): runs sent with enqueue (named, or the default
// of a gateway whose Config.Multitask is enqueue or empty) while a run of their thread
// streams, from four sockets on two gateways, are accepted at once (run.accepted,
// then run.queued with how many runs are ahead), start one after another in order of
// acceptance, and each agent answers in the context of the runs before it; a queued run
// aborted leaves the queue with RUN_ERROR aborted, never reaching the model, and the thread.
func TestMultitaskEnqueue(t *testing.T) {
	model := newChatModel(t)
	model.slow["a long question"] = 1500 * time.Millisecond
	e1 := newEnv(t, envOptions{agent: model.agent()})
	e2 := newEnv(t, envOptions{natsURL: e1.store.ClientURL(), agent: model.agent(), multitask: conversation.MultitaskEnqueue})

	a := dial(t, e1.url(), "")
	a.send(userFrame("r1", "u1", "user", "a long question"))
	if f := a.next(20 * time.Second); summary([]frame{f}) != "CUSTOM:run.accepted" {
		t.Fatalf("r1's first frame: %s", f.raw)
	}
	queued := func(cl *client, runID string, ahead int) {
		t.Helper()
		got := cl.untilN(t, 2)
		if summary(got) != "CUSTOM:run.accepted CUSTOM:run.queued" || !strings.Contains(got[1].raw, fmt.Sprintf(`"value":{"ahead":%d}`, ahead)) {
			t.Fatalf("%s's first frames: %s, %s; want run.accepted, run.queued ahead %d", runID, got[0].raw, got[1].raw, ahead)
		}
	}
	b := dial(t, e2.url(), "") // the gateway's default is enqueue
	b.send(userFrame("r2", "u2", "user", "second"))
	queued(b, "r2", 1)
	c := dial(t, e1.url(), "")
	c.send(withStrategy(userFrame("r3", "u3", "user", "third"), "enqueue"))
	queued(c, "r3", 2)
	d := dial(t, e1.url(), "") // Config.Multitask is empty: the default is enqueue
	d.send(userFrame("r4", "u4", "user", "never"))
	queued(d, "r4", 3)
	d.send(abortFrame("r4"))
	e1.waitClosed(t, "r4")
	if log, _ := e1.resume(t, "r4", "-1"); summary(log) != "CUSTOM:run.accepted CUSTOM:run.queued RUN_ERROR:aborted" {
		t.Errorf("log of r4, aborted while queued: %s", summary(log))
	}

	for _, cl := range []*client{a, b, c} {
		if got := summary(cl.untilTerminal()); !strings.HasSuffix(got, "RUN_FINISHED") {
			t.Fatalf("a run ended %s", got)
		}
	}
	sameMessages(t, "r1", model.request(1), "user: a long question")
	sameMessages(t, "r2, queued behind r1", model.request(2),
		"user: a long question", "assistant: answer 1", "user: second")
	sameMessages(t, "r3, queued behind r2", model.request(3),
		"user: a long question", "assistant: answer 1", "user: second", "assistant: answer 2", "user: third")
	model.mu.Lock()
	n := len(model.requests)
	model.mu.Unlock()
	if n != 3 {
		t.Errorf("the model received %d requests, want 3 (the aborted queued run never reaches it)", n)
	}
	h := e2.hydrate(t, "/api/chat", "", "threadId", "T")
	if got, want := h.summary(), "u1 user: a long question | "; !strings.HasPrefix(got, want) || strings.Contains(got, "never") ||
		strings.Count(got, "assistant") != 3 || strings.Index(got, "second") > strings.Index(got, "third") {
		t.Errorf("hydrate after the queue: %s", got)
	}
}

// TestMultitaskInterrupt (THREADS.md section 6): a run sent with interrupt, through another
// gateway, while a run of its thread streams: the streaming run ends RUN_ERROR code
// interrupted (live, on its own socket), its partial reply kept in the thread; the new run
// is accepted and queued at once, then starts and finishes after it.
func TestMultitaskInterrupt(t *testing.T) {
	e1 := newEnv(t, envOptions{})
	e2 := newEnv(t, envOptions{natsURL: e1.store.ClientURL()})

	a := dial(t, e1.url(), "")
	a.send(threadFrame("T", "r1", script{Tokens: 1000, IntervalMs: 20}, "u1", "first"))
	a.untilN(t, 5) // the marker, RUN_STARTED, TEXT_MESSAGE_START, two deltas
	b := dial(t, e2.url(), "")
	b.send(withStrategy(threadFrame("T", "r2", script{Tokens: 2}, "u2", "second"), "interrupt"))
	rest := a.untilTerminal()
	if got := summary(rest[len(rest)-1:]); got != "RUN_ERROR:interrupted" {
		t.Errorf("the interrupted run ended %s, want RUN_ERROR:interrupted", got)
	}
	want := "CUSTOM:run.accepted CUSTOM:run.queued RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED"
	if got := summary(b.untilTerminal()); got != want {
		t.Errorf("the interrupting run: %s, want %s", got, want)
	}
	e1.waitClosed(t, "r2")
	th, err := e1.threads.Thread(context.Background(), "p1", "T")
	if err != nil {
		t.Fatal(err)
	}
	if len(th.Runs) != 2 || th.Runs[0].State != threadstore.ThreadRunError || th.Runs[0].Code != "interrupted" {
		t.Errorf("thread runs = %+v, want r1 ended interrupted", th.Runs)
	}
	h := e2.hydrate(t, "/api/chat", "", "threadId", "T")
	if s := h.summary(); !strings.HasPrefix(s, "u1 user: first | m-r1-1 assistant: t1 t2") || !strings.HasSuffix(s, "u2 user: second | m-r2-1 assistant: t1 t2  | ") {
		t.Errorf("hydrate after the interrupt: %s", s)
	}
}

// TestMultitaskRollback (THREADS.md section 6): a run sent with rollback, through another
// gateway, while a run of its thread streams: the streaming run ends RUN_ERROR code
// interrupted, and its user message and partial reply leave the thread (a hydrate no longer
// shows them); the new run is queued, then starts after it.
func TestMultitaskRollback(t *testing.T) {
	e1 := newEnv(t, envOptions{})
	e2 := newEnv(t, envOptions{natsURL: e1.store.ClientURL()})

	a := dial(t, e1.url(), "")
	a.send(threadFrame("T", "r0", script{Tokens: 1}, "u0", "zeroth"))
	a.untilTerminal()
	a.send(threadFrame("T", "r1", script{Tokens: 1000, IntervalMs: 20}, "u1", "first"))
	a.untilN(t, 5) // the marker, RUN_STARTED, TEXT_MESSAGE_START, two deltas
	b := dial(t, e2.url(), "")
	b.send(withStrategy(threadFrame("T", "r2", script{Tokens: 2}, "u2", "second"), "rollback"))
	rest := a.untilTerminal()
	if got := summary(rest[len(rest)-1:]); got != "RUN_ERROR:interrupted" {
		t.Errorf("the rolled back run ended %s, want RUN_ERROR:interrupted", got)
	}
	want := "CUSTOM:run.accepted CUSTOM:run.queued RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED"
	if got := summary(b.untilTerminal()); got != want {
		t.Errorf("the rolling back run: %s, want %s", got, want)
	}
	e1.waitClosed(t, "r2")
	for _, e := range []*env{e1, e2} {
		h := e.hydrate(t, "/api/chat", "", "threadId", "T")
		if s := h.summary(); s != "u0 user: zeroth | m-r0-1 assistant: t1  | u2 user: second | m-r2-1 assistant: t1 t2  | " {
			t.Errorf("hydrate after the rollback: %s, want r1's message and reply gone", s)
		}
	}
	th, err := e1.threads.Thread(context.Background(), "p1", "T")
	if err != nil {
		t.Fatal(err)
	}
	if r := th.Runs[len(th.Runs)-2]; r.RunID != "r1" || r.State != threadstore.ThreadRunError || r.Code != "interrupted" {
		t.Errorf("thread runs = %+v, want r1 ended interrupted", th.Runs)
	}
}

// TestMultitaskRollbackContext: the agent of a run sent with rollback answers from the thread
// without the run it rolled back, whether that run's finish reached the thread before the new
// run started or not.
func TestMultitaskRollbackContext(t *testing.T) {
	model := newChatModel(t)
	model.slow["first"] = 3 * time.Second
	e1 := newEnv(t, envOptions{agent: model.agent()})
	e2 := newEnv(t, envOptions{natsURL: e1.store.ClientURL(), agent: model.agent()})

	a := dial(t, e1.url(), "")
	a.send(userFrame("r0", "u0", "user", "hello"))
	a.untilTerminal()
	a.send(userFrame("r1", "u1", "user", "first"))
	a.untilN(t, 2) // the marker, RUN_STARTED: the model has the request
	b := dial(t, e2.url(), "")
	b.send(withStrategy(userFrame("r2", "u0", "user", "hello", "u1", "user", "first", "u2", "user", "second"), "rollback"))
	b.untilTerminal()
	sameMessages(t, "the rolling back run", model.request(3), "user: hello", "assistant: answer 1", "user: second")
	if got := summary(a.untilTerminal()); !strings.HasSuffix(got, "RUN_ERROR:interrupted") {
		t.Errorf("the rolled back run: %s", got)
	}
}

// TestMultitaskConfig: New refuses a Config.Multitask that names no strategy; every strategy,
// and none (enqueue), is taken.
func TestMultitaskConfig(t *testing.T) {
	for _, m := range append([]string{"", "sometimes"}, protocol.MultitaskStrategies...) {
		srv, err := conversation.New(conversation.Config{Store: newMemStore(), Agent: demo.New(), Multitask: m})
		if bad := m == "sometimes"; bad != errors.Is(err, conversation.ErrConfig) {
			t.Errorf("New with Multitask %q = %v", m, err)
		}
		if srv != nil {
			srv.Shutdown(context.Background())
		}
	}
}
