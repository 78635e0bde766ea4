package conversation_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/conversation"
)

// threadFrame is a run frame of thread threadID whose messages are (id, text) user messages.
func threadFrame(threadID, runID string, sc script, msgs ...string) []byte {
	var ms []any
	for i := 0; i+1 < len(msgs); i += 2 {
		ms = append(ms, map[string]any{"id": msgs[i], "role": "user", "content": msgs[i+1]})
	}
	b, _ := json.Marshal(map[string]any{"threadId": threadID, "runId": runID, "messages": ms,
		"forwardedProps": map[string]any{"test": sc}})
	return b
}

// hydrated is a hydrate's answer, decoded.
type hydrated struct {
	Messages []struct {
		ID    string `json:"id"`
		Role  string `json:"role"`
		Parts []struct {
			Type    string `json:"type"`
			Content string `json:"content"`
		} `json:"parts"`
	} `json:"messages"`
	ActiveRun  *struct{ RunID string } `json:"activeRun"`
	Interrupts json.RawMessage         `json:"interrupts"`
	Page       *struct {
		Truncated bool   `json:"truncated"`
		Cursor    string `json:"cursor"`
	} `json:"page"`
	raw string
}

// summary writes the messages as "id role: text | …".
func (h hydrated) summary() string {
	var b strings.Builder
	for _, m := range h.Messages {
		fmt.Fprintf(&b, "%s %s:", m.ID, m.Role)
		for _, p := range m.Parts {
			fmt.Fprintf(&b, " %s", p.Content)
		}
		b.WriteString(" | ")
	}
	return b.String()
}

// hydrate GETs path?threadId=… (and kv pairs) as principal and decodes the answer.
func (e *env) hydrate(t testing.TB, path, principal string, kv ...string) hydrated {
	t.Helper()
	h := http.Header{"Accept": {"application/json"}}
	if principal != "" {
		h.Set("X-Principal", principal)
	}
	resp := e.httpDo(t, http.MethodGet, path, nil, h, kv...)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" ||
		resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("hydrate: status %d, %q, %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), resp.Header.Get("Cache-Control"), b)
	}
	var out hydrated
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("hydrate: %v: %s", err, b)
	}
	out.raw = string(bytes.TrimSpace(b))
	return out
}

const emptyThread = `{"messages":[],"activeRun":null,"interrupts":null}`

// TestHydrate: a finished turn's thread hydrates the same on both chat paths, with the user's
// message and the reply; an unknown thread and another principal's are empty.
func TestHydrate(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.open(t, "/api/chat", http.MethodPost, threadFrame("T", "r1", script{Tokens: 3}, "u1", "hello"), nil).all()
	e.open(t, "/api/chat/ndjson", http.MethodPost, threadFrame("T", "r2", script{Tokens: 1}, "u1", "hello", "u2", "again"), nil).all()
	sse := e.hydrate(t, "/api/chat", "", "threadId", "T")
	ndjson := e.hydrate(t, "/api/chat/ndjson", "", "threadId", "T")
	if sse.raw != ndjson.raw {
		t.Errorf("the chat paths answer differently:\n%s\n%s", sse.raw, ndjson.raw)
	}
	want := "u1 user: hello | m-r1-1 assistant: t1 t2 t3  | u2 user: again | m-r2-1 assistant: t1  | "
	if got := sse.summary(); got != want || sse.ActiveRun != nil || string(sse.Interrupts) != "null" || sse.Page != nil {
		t.Errorf("hydrate = %s\nwant messages %s", sse.raw, want)
	}
	for _, tt := range []struct{ name, principal, thread string }{
		{"unknown thread", "", "nope"},
		{"another principal's", "p2", "T"},
	} {
		if got := e.hydrate(t, "/api/chat", tt.principal, "threadId", tt.thread).raw; got != emptyThread {
			t.Errorf("%s: hydrate = %s, want %s", tt.name, got, emptyThread)
		}
	}
}

// heldThreads holds every AcceptRun, the write of a new run into its thread, until release
// is closed.
type heldThreads struct {
	threads
	release chan struct{}
}

// threads names the embedded Threads of a wrapper, whose method Threads it would hide.
type threads = conversation.Threads

func (h heldThreads) AcceptRun(ctx context.Context, principal, threadID, runID string, input json.RawMessage, ahead conversation.ThreadAhead, o conversation.Overlap) (conversation.Thread, error) {
	select {
	case <-h.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return h.threads.AcceptRun(ctx, principal, threadID, runID, input, ahead, o)
}

// TestFirstEventBesideThreadWrite: a turn's first event is stored while its thread is being
// written, not after (one round trip less before the first token), and reaches its socket
// only once the thread knows the run, so a hydrate right after it reports the run.
func TestFirstEventBesideThreadWrite(t *testing.T) {
	hold := heldThreads{release: make(chan struct{})}
	e := newEnv(t, envOptions{wrapThreads: func(th conversation.Threads) conversation.Threads {
		hold.threads = th
		return hold
	}})
	cl := dial(t, e.url(), "p1")
	var released atomic.Bool
	first := make(chan frame, 1)
	go func() {
		f := cl.next(10 * time.Second)
		if released.Load() {
			first <- f
		} else {
			first <- frame{err: fmt.Errorf("frame %s arrived before the thread knew the run", f.raw)}
		}
	}()
	cl.send(threadFrame("T", "r1", script{Tokens: 1}, "u1", "hello"))

	// The thread's write is held: the run's log gets its first event all the same.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		entries, _, err := e.store.Snapshot(ctx, "p1", "r1")
		if err == nil && len(entries) > 0 {
			if got := string(entries[0].Event); !strings.Contains(got, "run.accepted") {
				t.Fatalf("first stored event = %s, want run.accepted", got)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the run's first event was not stored while its thread's write was held: %d entries, %v", len(entries), err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if h := e.hydrate(t, "/api/chat", "", "threadId", "T"); h.ActiveRun != nil {
		t.Fatalf("hydrate while the thread's write is held = %s", h.raw)
	}
	time.Sleep(100 * time.Millisecond) // time enough for a delivery that does not wait

	released.Store(true)
	close(hold.release)
	f := <-first
	if f.err != nil || !strings.Contains(string(f.raw), "run.accepted") {
		t.Fatalf("first frame = %s, %v; want run.accepted", f.raw, f.err)
	}
	if h := e.hydrate(t, "/api/chat", "", "threadId", "T"); h.ActiveRun == nil && !strings.Contains(h.summary(), "m-r1-1") {
		t.Fatalf("hydrate after the first event = %s: neither the run active nor its reply", h.raw)
	}
	if got := summary(cl.untilTerminal()); !strings.HasSuffix(got, "RUN_FINISHED") {
		t.Fatalf("the rest of the turn = %s", got)
	}
}

// TestHydrateActiveRun: from a turn's first event on, a hydrate reports it with the user's
// message; while it runs, with its reply so far; once it is aborted, the partial reply stays
// and no run is active.
func TestHydrateActiveRun(t *testing.T) {
	e := newEnv(t, envOptions{})
	st := e.open(t, "/api/chat", http.MethodPost, threadFrame("T", "r1", script{Tokens: 2, Block: true}, "u1", "hello"), nil)
	st.n(1) // run.accepted
	h := e.hydrate(t, "/api/chat", "", "threadId", "T")
	if h.ActiveRun == nil || h.ActiveRun.RunID != "r1" || !strings.HasPrefix(h.summary(), "u1 user: hello | ") {
		t.Fatalf("hydrate after the first event = %s", h.raw)
	}
	st.n(4) // RUN_STARTED, TEXT_MESSAGE_START and both deltas
	h = e.hydrate(t, "/api/chat", "", "threadId", "T")
	if h.ActiveRun == nil || h.ActiveRun.RunID != "r1" || h.summary() != "u1 user: hello | m-r1-1 assistant: t1 t2  | " {
		t.Fatalf("hydrate while running = %s", h.raw)
	}
	if code, body := e.abortHTTP(t, "r1", ""); code != http.StatusOK {
		t.Fatalf("abort = %d %s", code, body)
	}
	h = e.hydrate(t, "/api/chat", "", "threadId", "T")
	if h.ActiveRun != nil || h.summary() != "u1 user: hello | m-r1-1 assistant: t1 t2  | " {
		t.Fatalf("hydrate after the abort = %s", h.raw)
	}
}

// TestHydratePages: limit and before page the transcript, newest window first, without a
// gap or a duplicate; an invalid limit answers everything.
func TestHydratePages(t *testing.T) {
	e := newEnv(t, envOptions{})
	var msgs []string
	for i := 1; i <= 3; i++ {
		msgs = append(msgs, fmt.Sprintf("u%d", i), fmt.Sprintf("q%d", i))
		e.open(t, "/api/chat", http.MethodPost, threadFrame("T", fmt.Sprintf("r%d", i), script{Tokens: 1}, msgs...), nil).all()
	}
	first := e.hydrate(t, "/api/chat", "", "threadId", "T", "limit", "4")
	if first.summary() != "u2 user: q2 | m-r2-1 assistant: t1  | u3 user: q3 | m-r3-1 assistant: t1  | " ||
		first.Page == nil || !first.Page.Truncated || first.Page.Cursor == "" {
		t.Fatalf("first page = %s", first.raw)
	}
	older := e.hydrate(t, "/api/chat", "", "threadId", "T", "limit", "4", "before", first.Page.Cursor)
	if older.summary() != "u1 user: q1 | m-r1-1 assistant: t1  | " || older.Page == nil || older.Page.Truncated {
		t.Fatalf("older page = %s", older.raw)
	}
	if all := e.hydrate(t, "/api/chat", "", "threadId", "T", "limit", "x"); len(all.Messages) != 6 || all.Page != nil {
		t.Fatalf("limit=x = %s", all.raw)
	}
}

// TestRefusedRunLeavesThread: a run frame with another principal's runId is refused, and
// neither its thread nor the runId's owner's thread shows it: the thread is read while the
// log is created, and written only once the log exists.
func TestRefusedRunLeavesThread(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.open(t, "/api/chat", http.MethodPost, threadFrame("T", "r1", script{Tokens: 1}, "u1", "hello"), nil).all()
	owner := e.hydrate(t, "/api/chat", "", "threadId", "T").raw
	p2 := http.Header{"X-Principal": {"p2"}}
	for _, thread := range []string{"T", "T2"} {
		got := summary(e.open(t, "/api/chat", http.MethodPost, threadFrame(thread, "r1", script{Tokens: 1}, "u9", "intruder"), p2).all())
		if got != "bare RUN_ERROR:forbidden" {
			t.Fatalf("another principal's runId in thread %s: %s, want bare RUN_ERROR:forbidden", thread, got)
		}
		if h := e.hydrate(t, "/api/chat", "p2", "threadId", thread).raw; h != emptyThread {
			t.Errorf("the refused run's thread %s = %s, want %s", thread, h, emptyThread)
		}
	}
	if h := e.hydrate(t, "/api/chat", "", "threadId", "T").raw; h != owner {
		t.Errorf("the runId's owner's thread changed:\n%s\nwant\n%s", h, owner)
	}
}

// TestThreadOutlivesRunLogs: once a run's log has aged out, its thread still hydrates its
// messages, with no active run.
func TestThreadOutlivesRunLogs(t *testing.T) {
	e := newEnv(t, envOptions{retention: 2 * time.Second})
	e.open(t, "/api/chat", http.MethodPost, threadFrame("T", "r1", script{Tokens: 2}, "u1", "hello"), nil).all()
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp := e.httpDo(t, http.MethodGet, "/api/chat", nil, nil, "runId", "r1", "offset", "-1")
		resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run's log is still readable after 60s (status %d)", resp.StatusCode)
		}
		time.Sleep(200 * time.Millisecond)
	}
	h := e.hydrate(t, "/api/chat", "", "threadId", "T")
	if h.ActiveRun != nil || h.summary() != "u1 user: hello | m-r1-1 assistant: t1 t2  | " {
		t.Fatalf("hydrate after the run log expired = %s", h.raw)
	}
}

// TestThreadListDelete: GET /api/threads lists the principal's threads newest first, a page
// at a time; DELETE removes one with its run logs, and answers 404 to another principal.
func TestThreadListDelete(t *testing.T) {
	e := newEnv(t, envOptions{})
	for i := 1; i <= 3; i++ {
		e.open(t, "/api/chat", http.MethodPost, threadFrame(fmt.Sprintf("T%d", i), fmt.Sprintf("r%d", i), script{Tokens: 1},
			"u1", fmt.Sprintf("question %d %s", i, strings.Repeat("x", 100))), nil).all()
	}
	type list struct {
		Threads []struct {
			ThreadID, Title, CreatedAt, UpdatedAt string
			ActiveRun                             *struct{ RunID string }
		} `json:"threads"`
		Page struct {
			Truncated bool
			Cursor    string
		} `json:"page"`
	}
	get := func(principal string, kv ...string) list {
		t.Helper()
		resp := e.httpDo(t, http.MethodGet, "/api/threads", nil, http.Header{"X-Principal": {principal}}, kv...)
		var l list
		if err := json.NewDecoder(resp.Body).Decode(&l); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /api/threads: %d, %v", resp.StatusCode, err)
		}
		return l
	}
	page := get("p1", "limit", "2")
	if len(page.Threads) != 2 || page.Threads[0].ThreadID != "T3" || page.Threads[1].ThreadID != "T2" || !page.Page.Truncated {
		t.Fatalf("first page = %+v", page)
	}
	if title := page.Threads[0].Title; title != "question 3 "+strings.Repeat("x", 69) {
		t.Errorf("title = %q, want the first 80 characters of the first user message", title)
	}
	if _, err := time.Parse(time.RFC3339, page.Threads[0].CreatedAt); err != nil || page.Threads[0].ActiveRun != nil {
		t.Errorf("thread = %+v", page.Threads[0])
	}
	rest := get("p1", "limit", "2", "before", page.Page.Cursor)
	if len(rest.Threads) != 1 || rest.Threads[0].ThreadID != "T1" || rest.Page.Truncated {
		t.Fatalf("second page = %+v", rest)
	}
	if other := get("p2"); len(other.Threads) != 0 {
		t.Fatalf("another principal's list = %+v", other)
	}
	del := func(principal, threadID string) int {
		resp := e.httpDo(t, http.MethodDelete, "/api/threads/"+threadID, nil, http.Header{"X-Principal": {principal}})
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := del("p2", "T2"); code != http.StatusNotFound {
		t.Fatalf("another principal's DELETE = %d, want 404", code)
	}
	if code := del("p1", "T2"); code != http.StatusNoContent {
		t.Fatalf("DELETE = %d, want 204", code)
	}
	if h := e.hydrate(t, "/api/chat", "p1", "threadId", "T2"); h.raw != emptyThread {
		t.Errorf("hydrate of a deleted thread = %s", h.raw)
	}
	resp := e.httpDo(t, http.MethodGet, "/api/chat", nil, nil, "runId", "r2", "offset", "-1")
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("replay of a deleted thread's run = %d, want 404", resp.StatusCode)
	}
	if l := get("p1"); len(l.Threads) != 2 || l.Threads[0].ThreadID != "T3" || l.Threads[1].ThreadID != "T1" {
		t.Errorf("list after delete = %+v", l)
	}
}

// TestJoinFromStartWhileRunning: a join from -1 (what a hydrated client does for the active
// run) gets the run's stored events at once, while the turn still runs, on both chat paths.
func TestJoinFromStartWhileRunning(t *testing.T) {
	e := newEnv(t, envOptions{})
	for _, fr := range framings {
		t.Run(fr.name, func(t *testing.T) {
			runID := "join-start-" + fr.name
			live := e.open(t, fr.path, http.MethodPost, threadFrame("T-"+fr.name, runID, script{Tokens: 1, Block: true}, "u1", "hi"), nil)
			live.n(4)
			join := e.open(t, fr.path, http.MethodGet, nil, http.Header{"Accept": {"text/event-stream"}}, "runId", runID, "offset", "-1")
			if s := summary(join.n(4)); s != "CUSTOM:run.accepted RUN_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT" {
				t.Fatalf("join from -1 while running = %s", s)
			}
			if code, body := e.abortHTTP(t, runID, ""); code != http.StatusOK {
				t.Fatalf("abort = %d %s", code, body)
			}
		})
	}
}

// BenchmarkHydrate measures a hydrate (GET /api/chat?threadId=) of a finished 200-message
// thread (100 turns of a user message and a 10-token reply) over loopback HTTP, and reports
// the bytes the thread takes in its NATS bucket (the stream's bytes: its one value with its
// headers).
func BenchmarkHydrate(b *testing.B) {
	e := newEnv(b, envOptions{})
	var msgs []string
	for i := range 100 {
		msgs = append(msgs, fmt.Sprintf("u%d", i), fmt.Sprintf("question number %d, of some ordinary length", i))
		e.open(b, "/api/chat", http.MethodPost, threadFrame("T", fmt.Sprintf("r%d", i), script{Tokens: 10}, msgs[len(msgs)-2:]...), nil).all()
	}
	if h := e.hydrate(b, "/api/chat", "", "threadId", "T"); len(h.Messages) != 200 {
		b.Fatalf("hydrate holds %d messages, want 200", len(h.Messages))
	}
	ctx := context.Background()
	kv, err := e.store.JetStream().KeyValue(ctx, "wsgateway_threads")
	if err != nil {
		b.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		b.Fatal(err)
	}
	u := e.http.URL + "/api/chat?threadId=T"
	b.ResetTimer()
	for b.Loop() {
		resp, err := http.Get(u)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	b.ReportMetric(float64(st.Bytes()), "thread-bytes")
}

// TestThreadsPerPrincipal: a run that would start a thread beyond the principal's bound ends
// RUN_ERROR limit_exceeded naming the flag, right after run.accepted, and leaves no thread;
// the principal's threads take runs as before, another principal starts threads of its own,
// and once a thread is deleted a new one starts.
func TestThreadsPerPrincipal(t *testing.T) {
	e := newEnv(t, envOptions{maxThreads: 2})
	cl := dial(t, e.url(), "")
	turnOn := func(cl *client, threadID, runID string) []frame {
		t.Helper()
		cl.send(threadFrame(threadID, runID, script{Tokens: 1}, "u-"+runID, "hello"))
		return cl.untilTerminal()
	}
	for _, id := range []string{"A", "B"} {
		if fs := turnOn(cl, id, "r-"+id); fs[len(fs)-1].Type != "RUN_FINISHED" {
			t.Fatalf("thread %s: %v", id, summary(fs))
		}
	}
	fs := turnOn(cl, "C", "r-C")
	if s := summary(fs); s != "CUSTOM:run.accepted RUN_ERROR:"+conversation.CodeLimitExceeded || !strings.Contains(fs[1].raw, "max-threads-per-principal") {
		t.Fatalf("a third thread's run: %s %s, want run.accepted then RUN_ERROR limit_exceeded naming the flag", s, fs[len(fs)-1].raw)
	}
	if h := e.hydrate(t, "/api/chat", "", "threadId", "C"); h.raw != emptyThread {
		t.Fatalf("the refused thread hydrates %s", h.raw)
	}
	if fs := turnOn(cl, "A", "r-A2"); fs[len(fs)-1].Type != "RUN_FINISHED" {
		t.Fatalf("a run of an existing thread: %v", summary(fs))
	}
	if fs := turnOn(dial(t, e.url(), "bob"), "C", "r-bob-C"); fs[len(fs)-1].Type != "RUN_FINISHED" {
		t.Fatalf("another principal's thread: %v", summary(fs))
	}
	resp := e.httpDo(t, http.MethodDelete, "/api/threads/B", nil, nil)
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("delete: %d", resp.StatusCode)
	}
	if fs := turnOn(cl, "C", "r-C2"); fs[len(fs)-1].Type != "RUN_FINISHED" {
		t.Fatalf("a new thread after a delete: %v", summary(fs))
	}
}
