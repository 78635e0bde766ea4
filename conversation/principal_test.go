package conversation_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/conversation"
)

// startAs starts a turn of runID as principal through a door: "ws" (a run frame on sock),
// "sse", "ndjson", "agui" (a POST, whose client walks away once the turn has begun) or
// "thread" (POST /api/threads/thread-1/runs). Its turns run side by side in their thread
// (multitaskStrategy concurrent). A turn it started is aborted when the test
// ends. It returns what the door answered: "started", or the
// refusal ("RUN_ERROR limit_exceeded: <message>" on the socket, "<status> <body>" over HTTP).
func (e *env) startAs(t *testing.T, door, principal, runID string, sock *client) string {
	t.Helper()
	blocked := script{Tokens: 1, Block: true}
	frame := withStrategy(runFrame(runID, blocked), conversation.MultitaskConcurrent)
	t.Cleanup(func() { // the Server's Shutdown would wait for the blocked turn
		resp := e.httpDo(t, http.MethodPost, "/api/runs/"+runID+"/abort", nil, http.Header{"X-Principal": {principal}})
		resp.Body.Close()
	})
	h := http.Header{"X-Principal": {principal}}
	answer := func(resp *http.Response) string {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}
	switch door {
	case "ws":
		sock.send(frame)
		f := sock.next(10 * time.Second)
		var ev struct{ Name, Code, Message string }
		json.Unmarshal(f.Event, &ev)
		if f.Type == "CUSTOM" && ev.Name == "run.accepted" {
			sock.untilN(t, 3) // RUN_STARTED, START, delta
			return "started"
		}
		return fmt.Sprintf("%s %s: %s", f.Type, ev.Code, ev.Message)
	case "thread":
		resp := e.httpDo(t, http.MethodPost, "/api/threads/thread-1/runs", frame, h)
		if resp.StatusCode == http.StatusAccepted {
			return "started"
		}
		return answer(resp)
	}
	path := map[string]string{"sse": "/api/chat", "ndjson": "/api/chat/ndjson", "agui": "/agui"}[door]
	h.Set("X-Run-Id", runID)
	resp := e.httpDo(t, http.MethodPost, path, frame, h)
	defer resp.Body.Close() // the client walks away; the turn goes on
	if resp.StatusCode != http.StatusOK {
		return answer(resp)
	}
	// The stream began: its first line arrives.
	if _, err := resp.Body.Read(make([]byte, 1)); err != nil {
		t.Fatalf("%s stream of %s: %v", door, runID, err)
	}
	return "started"
}

var doors = []string{"ws", "sse", "ndjson", "agui", "thread"}

// refusals returns each door's answer (startAs) to a start refused with msg.
func refusals(msg string) map[string]string {
	return map[string]string{"ws": "RUN_ERROR limit_exceeded: " + msg, "sse": "429 " + msg, "ndjson": "429 " + msg,
		"agui": "429 " + msg, "thread": `429 {"error":"` + msg + `"}`}
}

// TestPrincipalTurnsEveryDoor: one principal's running turns are bounded whatever door
// started them, and the turns of clients that walked away still count; a refused start
// creates no log; another principal, and a principal given more by PrincipalLimits, start
// theirs meanwhile; an ended turn frees its place.
func TestPrincipalTurnsEveryDoor(t *testing.T) {
	max := len(doors) // one turn by each door fills the bound
	e := newEnv(t, envOptions{principalTurns: max,
		principalLimits: map[string]conversation.PrincipalLimits{"svc": {Turns: max + 2}}})
	sock := dial(t, e.url(), "p1")
	for i, door := range doors {
		if got := e.startAs(t, door, "p1", fmt.Sprintf("held-%d", i), sock); got != "started" {
			t.Fatalf("turn %d by %s under the bound: %s", i, door, got)
		}
	}
	want := refusals(conversation.MsgPrincipalTurns)
	for _, door := range doors {
		if got := e.startAs(t, door, "p1", "over-"+door, sock); got != want[door] {
			t.Errorf("a turn by %s beyond the bound: %s, want %s", door, got, want[door])
		}
	}
	if n := e.metric(t, "wsgateway_conversation_limit_refusals_total", "max_principal_turns"); n != float64(len(doors)) {
		t.Errorf("limit refusals {max_principal_turns} = %v, want %d", n, len(doors))
	}
	for _, door := range doors {
		expectNoLog(t, e, "over-"+door)
	}
	// Another principal's turn, and svc's beyond p1's bound, start and complete meanwhile.
	other := dial(t, e.url(), "p2")
	other.send(runFrame("p2-run", script{Tokens: 3}))
	if got := summary(other.untilTerminal()); got != tokenTurn(3) {
		t.Errorf("p2's turn while p1 is at its bound = %s, want %s", got, tokenTurn(3))
	}
	svc := dial(t, e.url(), "svc")
	for i := 0; i < max+2; i++ {
		if got := e.startAs(t, "ws", "svc", fmt.Sprintf("svc-%d", i), svc); got != "started" {
			t.Fatalf("svc's turn %d under its own bound of %d: %s", i, max+2, got)
		}
	}
	if got := e.startAs(t, "thread", "svc", "svc-over", nil); got != `429 {"error":"`+conversation.MsgPrincipalTurns+`"}` {
		t.Errorf("svc's turn beyond its own bound: %s", got)
	}
	// An ended turn frees its place, whatever door started it.
	resp := e.httpDo(t, http.MethodPost, "/api/runs/held-1/abort", nil, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("abort of held-1: %d", resp.StatusCode)
	}
	if got := e.startAs(t, "ws", "p1", "after-abort", sock); got != "started" {
		t.Errorf("a turn of p1 after one of its turns ended: %s", got)
	}
}

// TestRefusalDelay: a start refused by a bound is answered after Config.RefusalDelay by
// every HTTP door, and a socket whose run frame was refused reads its next frame after it
// (the refusal itself is sent at once): a client that goes on asking is slowed to one
// refusal per delay.
func TestRefusalDelay(t *testing.T) {
	const delay = 400 * time.Millisecond
	e := newEnv(t, envOptions{principalTurns: 1, refusalDelay: delay})
	sock := dial(t, e.url(), "p1")
	if got := e.startAs(t, "ws", "p1", "held", sock); got != "started" {
		t.Fatalf("the one turn of the bound: %s", got)
	}
	want := refusals(conversation.MsgPrincipalTurns)
	for _, door := range doors[1:] { // the HTTP doors
		start := time.Now()
		if got := e.startAs(t, door, "p1", "over-"+door, sock); got != want[door] {
			t.Fatalf("a turn by %s beyond the bound: %s, want %s", door, got, want[door])
		}
		if took := time.Since(start); took < delay {
			t.Errorf("the refusal by %s took %v, want at least the refusal delay %v", door, took, delay)
		}
	}
	start := time.Now()
	for _, id := range []string{"over-ws", "over-ws-again"} {
		sock.send(withStrategy(runFrame(id, script{Tokens: 1}), conversation.MultitaskConcurrent))
	}
	for _, id := range []string{"over-ws", "over-ws-again"} {
		if f := sock.next(10 * time.Second); f.Type != "RUN_ERROR" {
			t.Fatalf("the answer to %s: %+v, want a RUN_ERROR", id, f)
		}
	}
	if took := time.Since(start); took < delay {
		t.Errorf("two refused run frames sent at once answered within %v, want the second one read after the refusal delay %v", took, delay)
	}
}

// TestPrincipalTurnRate: every door takes from one bucket per principal; beyond its burst a
// start is refused naming the limit and creates no log, and another principal's bucket is
// its own.
func TestPrincipalTurnRate(t *testing.T) {
	// A rate this low refills nothing during the test: the burst is all there is.
	e := newEnv(t, envOptions{turnStartRate: 0.001, turnStartBurst: len(doors)})
	sock := dial(t, e.url(), "p1")
	for i, door := range doors {
		if got := e.startAs(t, door, "p1", fmt.Sprintf("burst-%d", i), sock); got != "started" {
			t.Fatalf("start %d by %s within the burst: %s", i, door, got)
		}
	}
	want := refusals(conversation.MsgPrincipalTurnRate)
	for _, door := range doors {
		if got := e.startAs(t, door, "p1", "fast-"+door, sock); got != want[door] {
			t.Errorf("a start by %s beyond the burst: %s, want %s", door, got, want[door])
		}
		expectNoLog(t, e, "fast-"+door)
	}
	if n := e.metric(t, "wsgateway_conversation_limit_refusals_total", "principal_turn_rate"); n != float64(len(doors)) {
		t.Errorf("limit refusals {principal_turn_rate} = %v, want %d", n, len(doors))
	}
	other := dial(t, e.url(), "p2")
	other.send(runFrame("p2-run", script{Tokens: 1}))
	if got := summary(other.untilTerminal()); got != tokenTurn(1) {
		t.Errorf("p2's turn while p1's bucket is empty = %s, want %s", got, tokenTurn(1))
	}
}

// TestPrincipalTurnRateRetryAfter: an HTTP start refused for the principal's rate says in
// Retry-After when a start fits again: whole seconds, at most one token's time (10 s at 0.1/s);
// a start refused for the turns running says nothing (no time is known).
func TestPrincipalTurnRateRetryAfter(t *testing.T) {
	e := newEnv(t, envOptions{turnStartRate: 0.1, turnStartBurst: 1, principalTurns: 2})
	if got := e.startAs(t, "thread", "p1", "first", nil); got != "started" {
		t.Fatalf("the first start: %s", got)
	}
	for _, door := range []struct{ name, path string }{{"thread", "/api/threads/thread-1/runs"}, {"sse", "/api/chat"}, {"agui", "/agui"}} {
		resp := e.httpDo(t, http.MethodPost, door.path, runFrame("fast-"+door.name, script{Tokens: 1}), http.Header{"X-Principal": {"p1"}})
		resp.Body.Close()
		secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
		if resp.StatusCode != http.StatusTooManyRequests || err != nil || secs < 1 || secs > 10 {
			t.Errorf("a start by %s beyond the rate: %d, Retry-After %q, want 429 and 1 to 10 seconds", door.name, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	held := newEnv(t, envOptions{principalTurns: 1})
	if got := held.startAs(t, "thread", "p1", "held", nil); got != "started" {
		t.Fatalf("the first start: %s", got)
	}
	resp := held.httpDo(t, http.MethodPost, "/api/threads/thread-1/runs", runFrame("over", script{Tokens: 1}), http.Header{"X-Principal": {"p1"}})
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "" {
		t.Errorf("a start beyond max-principal-turns: %d, Retry-After %q, want 429 and none", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// countedThreads counts the reads of threads, and holds each read of a thread until release
// is closed.
type countedThreads struct {
	threads
	reads   *atomic.Int32
	release chan struct{}
}

func (c countedThreads) Thread(ctx context.Context, principal, threadID string) (conversation.Thread, error) {
	c.reads.Add(1)
	select {
	case <-c.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return c.threads.Thread(ctx, principal, threadID)
}

// countedStore counts the reads of run logs.
type countedStore struct {
	conversation.Store
	reads *atomic.Int32
}

func (c countedStore) Snapshot(ctx context.Context, principal, runID string) ([]conversation.Entry, bool, error) {
	c.reads.Add(1)
	return c.Store.Snapshot(ctx, principal, runID)
}

// TestHydratesPerPrincipal: a principal's hydrates in progress are bounded, and a hydrate
// beyond the bound is refused before it reads anything (neither the thread nor a run's log);
// another principal hydrates meanwhile; a hydrate that ended frees its place.
func TestHydratesPerPrincipal(t *testing.T) {
	const max = 2
	var reads atomic.Int32
	held := countedThreads{reads: &reads, release: make(chan struct{})}
	e := newEnv(t, envOptions{principalHydrates: max, wrapThreads: func(th conversation.Threads) conversation.Threads {
		held.threads = th
		return held
	}, wrap: func(s conversation.Store) conversation.Store { return countedStore{s, &reads} }})
	hydrate := func(principal string) (int, string) {
		resp := e.httpDo(t, http.MethodGet, "/api/chat", nil, http.Header{"X-Principal": {principal}}, "threadId", "T")
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	done := make(chan int, max+1)
	for i := 0; i < max; i++ {
		go func() {
			code, _ := hydrate("p1")
			done <- code
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for reads.Load() < max { // both hydrates are reading, held
		if time.Now().After(deadline) {
			t.Fatalf("%d hydrates reading after 10s, want %d", reads.Load(), max)
		}
		time.Sleep(time.Millisecond)
	}
	code, body := hydrate("p1")
	if want := `{"error":"` + conversation.MsgTooManyHydrates + `"}`; code != http.StatusTooManyRequests || body != want {
		t.Errorf("a hydrate beyond the bound: %d %s, want 429 %s", code, body, want)
	}
	if n := reads.Load(); n != max {
		t.Errorf("the refused hydrate read: %d reads, want %d (the held hydrates' only)", n, max)
	}
	if n := e.metric(t, "wsgateway_conversation_limit_refusals_total", "max_principal_hydrates"); n != 1 {
		t.Errorf("limit refusals {max_principal_hydrates} = %v, want 1", n)
	}
	go func() {
		code, _ := hydrate("p2")
		done <- code
	}()
	for reads.Load() < max+1 { // p2's hydrate reads while p1 is at its bound
		if time.Now().After(deadline) {
			t.Fatalf("p2's hydrate did not start reading while p1 held %d", max)
		}
		time.Sleep(time.Millisecond)
	}
	close(held.release)
	for i := 0; i < max+1; i++ {
		if code := <-done; code != http.StatusOK {
			t.Errorf("a held hydrate answered %d, want 200", code)
		}
	}
	if code, _ := hydrate("p1"); code != http.StatusOK {
		t.Errorf("p1's hydrate after its others ended: %d, want 200", code)
	}
}
