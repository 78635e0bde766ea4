package conversation_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/budget"
	"github.com/wsgateway/wsgateway/conversation"
	"github.com/wsgateway/wsgateway/protocol"
)

// expectLimit asserts that f is a bare RUN_ERROR code limit_exceeded whose message names
// the limit.
func expectLimit(t testing.TB, f frame, limit string) {
	t.Helper()
	var ev struct{ Message, Code string }
	json.Unmarshal(f.Event, &ev)
	if f.err != nil || f.Kind != protocol.FrameEvent || f.Type != "RUN_ERROR" || ev.Code != "limit_exceeded" ||
		!strings.HasPrefix(ev.Message, limit+":") {
		t.Fatalf("answer = %s (%v), want a bare RUN_ERROR code limit_exceeded naming %s", f.raw, f.err, limit)
	}
}

// expectAborted asserts that runID's log ends with RUN_ERROR code aborted (an abort sends
// nothing live).
func expectAborted(t testing.TB, e *env, runID string) {
	t.Helper()
	e.waitClosed(t, runID)
	replay, _ := e.resume(t, runID, "-1")
	if got := summary(replay); !strings.HasSuffix(got, " RUN_ERROR:aborted") {
		t.Errorf("log of %s = %s, want it ended by RUN_ERROR:aborted", runID, got)
	}
}

// waitNoTurns waits until no turn runs (and every socket forgot its turns).
func waitNoTurns(t testing.TB, e *env) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for e.srv.RunningTurns() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d turns still running after 20s", e.srv.RunningTurns())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// expectNoLog asserts that runID has no log: its resume closes 4404.
func expectNoLog(t testing.TB, e *env, runID string) {
	t.Helper()
	if _, end := e.resume(t, runID, "-1"); end.code != conversation.StatusUnknownRun {
		t.Errorf("resume of refused run %s closed %v, want 4404 (no log)", runID, end.err)
	}
}

func TestMaxTurnsPerSocket(t *testing.T) {
	e := newEnv(t, envOptions{memory: true, maxTurns: 2})
	cl := dial(t, e.url(), "")
	for _, id := range []string{"a", "b"} {
		cl.send(runFrame(id, script{Tokens: 1, Block: true}))
		cl.untilN(t, 4) // marker, RUN_STARTED, START, delta
	}
	cl.send(runFrame("c", script{Tokens: 1}))
	expectLimit(t, cl.next(10*time.Second), "max-socket-turns")
	if n := e.metric(t, "wsgateway_conversation_limit_refusals_total", "max_socket_turns"); n != 1 {
		t.Errorf("limit refusals {max_socket_turns} = %v, want 1", n)
	}
	// A resubmit of a running runId is not a new turn.
	cl.send(runFrame("a", script{Tokens: 1}))
	if got := summary(cl.untilTerminal()); got != tokenTurn(1) {
		t.Fatalf("resubmit at the cap = %s, want %s", got, tokenTurn(1))
	}
	cl.send(abortFrame("b"))
	expectAborted(t, e, "b")
	expectNoLog(t, e, "c")
	// The ended turns freed their places: c runs now, on the same socket.
	waitNoTurns(t, e)
	cl.send(runFrame("c", script{Tokens: 1}))
	if got := summary(cl.untilTerminal()); got != tokenTurn(1) {
		t.Errorf("c after the others ended = %s, want %s", got, tokenTurn(1))
	}
	// Another socket has places of its own.
	other := dial(t, e.url(), "")
	other.send(runFrame("d", script{Tokens: 1}))
	if got := summary(other.untilTerminal()); got != tokenTurn(1) {
		t.Errorf("turn on another socket = %s, want %s", got, tokenTurn(1))
	}
}

func TestRunFrameRate(t *testing.T) {
	// A rate this low refills nothing during the test: the burst is all there is.
	e := newEnv(t, envOptions{memory: true, runFrameRate: 0.001, runFrameBurst: 2})
	cl := dial(t, e.url(), "")
	for _, id := range []string{"a", "b"} {
		cl.send(runFrame(id, script{Tokens: 1, Block: true}))
		cl.untilN(t, 4)
	}
	for _, id := range []string{"c", "a", "e"} { // new runIds and a resubmit alike
		cl.send(runFrame(id, script{Tokens: 1}))
		expectLimit(t, cl.next(10*time.Second), "run-frame-rate")
	}
	if n := e.metric(t, "wsgateway_conversation_limit_refusals_total", "run_frame_rate"); n != 3 {
		t.Errorf("limit refusals {run_frame_rate} = %v, want 3", n)
	}
	// Aborts are not counted: they still stop the turns.
	for _, id := range []string{"a", "b"} {
		cl.send(abortFrame(id))
		expectAborted(t, e, id)
	}
	expectNoLog(t, e, "c")
	// Another socket has a bucket of its own.
	other := dial(t, e.url(), "")
	other.send(runFrame("d", script{Tokens: 1}))
	if got := summary(other.untilTerminal()); got != tokenTurn(1) {
		t.Errorf("turn on another socket = %s, want %s", got, tokenTurn(1))
	}
}

// dialStatus opens /ws as principal and returns the handshake's status and, when refused,
// its body; a socket it opened is closed when the test ends.
func dialStatus(t testing.TB, u, principal string) (int, string, *websocket.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"X-Principal": {principal}}})
	if err == nil {
		t.Cleanup(func() { c.CloseNow() })
		return resp.StatusCode, "", c
	}
	if resp == nil {
		t.Fatalf("Dial(%s) = %v", u, err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

func TestMaxSocketsPerPrincipal(t *testing.T) {
	const max = 4
	e := newEnv(t, envOptions{maxSockets: max})
	// p1 holds max: two conversation sockets, a resume socket and an HTTP stream, both
	// tailing a blocked turn.
	conv := dial(t, e.url(), "p1")
	conv.send(runFrame("held", script{Tokens: 1, Block: true}))
	conv.untilN(t, 4)
	second := dial(t, e.url(), "p1")
	tail := dial(t, e.url("runId", "held", "offset", "-1"), "p1")
	tail.untilN(t, 4)
	stream := e.open(t, "/api/chat", http.MethodGet, nil, nil, "runId", "held", "offset", "-1")
	stream.n(4)

	refusals := []struct {
		name string
		do   func() (int, string)
	}{
		{"conversation socket", func() (int, string) {
			code, body, _ := dialStatus(t, e.url(), "p1")
			return code, body
		}},
		{"resume socket", func() (int, string) {
			code, body, _ := dialStatus(t, e.url("runId", "held", "offset", "-1"), "p1")
			return code, body
		}},
		{"http stream", func() (int, string) {
			resp := e.httpDo(t, http.MethodGet, "/api/chat/ndjson", nil, nil, "runId", "held", "offset", "-1")
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}},
		{"http turn", func() (int, string) {
			resp := e.httpDo(t, http.MethodPost, "/api/chat", runFrame("x", script{Tokens: 1}), nil)
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}},
	}
	for _, r := range refusals {
		if code, body := r.do(); code != http.StatusTooManyRequests || strings.TrimSpace(body) != conversation.MsgTooManySockets {
			t.Errorf("%s beyond the cap: %d %q, want 429 %q", r.name, code, body, conversation.MsgTooManySockets)
		}
	}
	if n := e.metric(t, "wsgateway_conversation_limit_refusals_total", "max_principal_sockets"); n != float64(len(refusals)) {
		t.Errorf("limit refusals {max_principal_sockets} = %v, want %d", n, len(refusals))
	}
	// Another principal is unaffected.
	if code, _, _ := dialStatus(t, e.url(), "p2"); code != http.StatusSwitchingProtocols {
		t.Errorf("p2's socket: status %d, want 101", code)
	}
	// The sockets already open still serve (a turn of another thread than the held one's).
	second.send(threadRunFrame("other", "ok", script{Tokens: 1}))
	if got := summary(second.untilTerminal()); got != tokenTurn(1) {
		t.Errorf("turn on a held socket = %s, want %s", got, tokenTurn(1))
	}
	// A closed socket frees its slot.
	second.c.Close(websocket.StatusNormalClosure, "")
	e.waitMetric(t, "wsgateway_conversation_open_sockets", "conversation", 2) // conv and p2's
	code, _, again := dialStatus(t, e.url(), "p1")
	if code != http.StatusSwitchingProtocols {
		t.Fatalf("p1's socket after one closed: status %d, want 101", code)
	}
	again.CloseNow()
	// Every slot is freed once the sockets and the stream end: no entry stays behind.
	conv.send(abortFrame("held"))
	stream.all()
	tail.untilClose()
	conv.c.Close(websocket.StatusNormalClosure, "")
	deadline := time.Now().Add(20 * time.Second)
	for e.srv.HeldPrincipals() != 1 { // p2's socket, still open
		if time.Now().After(deadline) {
			t.Fatalf("%d principals hold sockets after p1 closed all, want 1 (p2)", e.srv.HeldPrincipals())
		}
		time.Sleep(5 * time.Millisecond)
	}
	expectNoLog(t, e, "x")
	expectAborted(t, e, "held")
}

// TestMemoryBudgetRefuses: while the gateway's memory budget is past three quarters (what
// other sockets' queues hold, here charged by the test), a new turn is refused with a bare
// RUN_ERROR limit_exceeded naming memory-budget before its log is created, a hydrate and a
// server-started run with 503; the turn already running is not failed by it. Once the memory
// is given back, the refused turn starts.
func TestMemoryBudgetRefuses(t *testing.T) {
	b := budget.New(1 << 20)
	e := newEnv(t, envOptions{budget: b})
	cl := dial(t, e.url(), "")
	cl.send(runFrame("a", script{Tokens: 1, Block: true}))
	cl.untilN(t, 4) // marker, RUN_STARTED, START, delta
	const held = 800 << 10
	b.Take(held)
	cl.send(runFrame("b", script{Tokens: 1}))
	expectLimit(t, cl.next(10*time.Second), "memory-budget")
	if n := e.metric(t, "wsgateway_conversation_limit_refusals_total", "memory_budget"); n != 1 {
		t.Errorf("limit refusals {memory_budget} = %v, want 1", n)
	}
	resp := e.httpDo(t, http.MethodGet, "/api/chat", nil, http.Header{"Accept": {"application/json"}}, "threadId", "thread-1")
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "memory-budget") {
		t.Errorf("hydrate near the budget = %d %s, want 503 naming memory-budget", resp.StatusCode, body)
	}
	resp = e.httpDo(t, http.MethodPost, "/api/threads/thread-2/runs", []byte(`{"messages":[]}`), http.Header{"Content-Type": {"application/json"}})
	body, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "memory-budget") {
		t.Errorf("server-started run near the budget = %d %s, want 503 naming memory-budget", resp.StatusCode, body)
	}
	expectNoLog(t, e, "b")
	cl.send(abortFrame("a")) // the running turn ended by its client, not by the budget
	b.Release(held)          // replays, such as expectAborted's, wait while it is held
	expectAborted(t, e, "a")
	cl.send(runFrame("b", script{Tokens: 1}))
	if got := summary(cl.untilTerminal()); got != tokenTurn(1) {
		t.Errorf("b once the memory is given back = %s, want %s", got, tokenTurn(1))
	}
}
