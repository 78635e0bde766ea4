package conversation_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/conversation"
	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/thread"
	"github.com/wsgateway/wsgateway/threadstore"
)

// memThreads is a conversation.Threads in memory, for the tests in which NATS is beside the
// point: one process's threads, each the thread store's value of it with no records (its runs
// and their transcript, package thread), no branches, no titles, no bound on a principal's
// threads. It keeps the contract the Server
// relies on: a thread is its principal's (ErrUnknownThread for another's), a run's acceptance
// merges its input, a run accepted again is running again, an Overlap with Ended refuses
// (*BusyError) or queues a run while an earlier one is active, a queued run starts when it is
// accepted again with none active, and a finish applies the run's events and records how it
// ended, as package thread applies them. A switch of branch, and a rollback, are refused
// (errMemThreads).
type memThreads struct {
	mu      sync.Mutex
	threads map[[2]string]*memThread // by principal and threadId
}

// memThread is one thread, kept as the thread store's value with no records: its methods
// (the runs' states, the runs ahead, the earlier runs) are the thread store's. A copy of it
// is the Thread a memThreads returns.
type memThread struct {
	t      threadstore.Thread
	inputs map[string]json.RawMessage // of the queued runs
}

var errMemThreads = errors.New("memThreads: branches and rollbacks are not kept in memory")

func newMemThreads() *memThreads { return &memThreads{threads: map[[2]string]*memThread{}} }

// copyOf returns a copy of t that the memThreads does not change.
func (t *memThread) copyOf() *memThread {
	c := &memThread{t: t.t}
	c.t.Runs = slices.Clone(t.t.Runs)
	c.t.Transcript = t.t.Transcript.Clone()
	return c
}

func (t *memThread) Runs() []conversation.ThreadRun {
	runs := make([]conversation.ThreadRun, len(t.t.Runs))
	for i, r := range t.t.Runs {
		runs[i] = conversation.ThreadRun{RunID: r.RunID, State: r.State}
	}
	return runs
}

func (t *memThread) ActiveRun() string                 { return t.t.ActiveRun() }
func (t *memThread) RunState(runID string) string      { return t.t.RunState(runID) }
func (t *memThread) Ahead(runID string) int            { return t.t.Ahead(runID) }
func (t *memThread) EarlierRuns(runID string) []string { return t.t.EarlierRuns(runID) }

// memAhead is a read ahead: the thread as it was, nil when there was none.
type memAhead struct{ t *memThread }

func (a memAhead) BusyWith(ctx context.Context, _, _, runID string, ended conversation.Ended) (string, error) {
	if a.t == nil {
		return "", nil
	}
	return a.t.t.BusyWith(ctx, runID, threadstore.Ended(ended))
}

func (m *memThreads) ReadThreadAhead(_ context.Context, principal, threadID string) conversation.ThreadAhead {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t := m.threads[[2]string{principal, threadID}]; t != nil {
		return memAhead{t.copyOf()}
	}
	return memAhead{}
}

func (m *memThreads) AcceptRun(ctx context.Context, principal, threadID, runID string, input json.RawMessage, _ conversation.ThreadAhead, o conversation.Overlap) (conversation.Thread, error) {
	if o.Rollback {
		return nil, errMemThreads
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	key := [2]string{principal, threadID}
	now := time.Now().UTC()
	t := m.threads[key]
	if t == nil {
		t = &memThread{inputs: map[string]json.RawMessage{}}
		t.t.Principal, t.t.ThreadID, t.t.Created = principal, threadID, now
		m.threads[key] = t
	}
	th := &t.t
	if o.Ended != nil {
		busy, err := th.BusyWith(ctx, runID, threadstore.Ended(o.Ended))
		switch {
		case err != nil:
			return nil, err
		case busy != "" && !o.Queue:
			return nil, &conversation.BusyError{ActiveRun: busy}
		case busy != "" && th.RunState(runID) == threadstore.ThreadRunQueued:
			return t.copyOf(), nil // still waiting
		case busy != "":
			th.Runs = append(th.Runs, threadstore.ThreadRun{RunID: runID, State: threadstore.ThreadRunQueued, Started: now})
			t.inputs[runID] = input
			th.Updated = now
			return t.copyOf(), nil
		}
	}
	if in, ok := t.inputs[runID]; ok { // a queued run starts
		input = in
		delete(t.inputs, runID)
	}
	if err := th.Transcript.Accept(runID, input); err != nil {
		return nil, err
	}
	started := threadstore.ThreadRun{RunID: runID, State: threadstore.ThreadRunRunning, Started: now}
	if i := slices.IndexFunc(th.Runs, func(r threadstore.ThreadRun) bool { return r.RunID == runID }); i >= 0 {
		th.Runs[i] = started
	} else {
		th.Runs = append(th.Runs, started)
	}
	th.Updated = now
	return t.copyOf(), nil
}

func (m *memThreads) FinishRun(_ context.Context, principal, threadID, runID string, events []json.RawMessage) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.threads[[2]string{principal, threadID}]
	if t == nil {
		return conversation.ErrUnknownThread
	}
	th := &t.t
	i := slices.IndexFunc(th.Runs, func(r threadstore.ThreadRun) bool { return r.RunID == runID })
	if i < 0 || th.Runs[i].State != threadstore.ThreadRunRunning {
		return nil // not the thread's, or ended already
	}
	if err := th.Transcript.Finish(runID, events); err != nil {
		return err
	}
	r := &th.Runs[i]
	r.State = threadstore.ThreadRunError // no terminal: the producer was lost
	if n := len(events); n > 0 {
		if end, ok := protocol.EndOf(events[n-1]); ok {
			r.State, r.Code = string(end.Kind), end.Code // a thread's ended states are the EndKinds
		}
	}
	r.Ended = time.Now().UTC()
	th.Updated = r.Ended
	return nil
}

func (m *memThreads) Thread(_ context.Context, principal, threadID string) (conversation.Thread, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t := m.threads[[2]string{principal, threadID}]; t != nil {
		return t.copyOf(), nil
	}
	return nil, conversation.ErrUnknownThread
}

func (m *memThreads) Threads(_ context.Context, principal string) ([]conversation.ThreadSummary, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var list []conversation.ThreadSummary
	for k, t := range m.threads {
		if k[0] == principal {
			list = append(list, conversation.ThreadSummary{ThreadID: t.t.ThreadID, Created: t.t.Created, Updated: t.t.Updated, ActiveRun: t.t.ActiveRun()})
		}
	}
	slices.SortFunc(list, func(a, b conversation.ThreadSummary) int {
		if c := b.Updated.Compare(a.Updated); c != 0 {
			return c
		}
		return strings.Compare(a.ThreadID, b.ThreadID)
	})
	return list, nil
}

func (m *memThreads) DeleteThread(_ context.Context, principal, threadID string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := [2]string{principal, threadID}
	if m.threads[key] == nil {
		return conversation.ErrUnknownThread
	}
	delete(m.threads, key)
	return nil
}

func (m *memThreads) SwitchBranch(context.Context, string, string, string) (conversation.Thread, error) {
	return nil, errMemThreads
}

func (m *memThreads) Hydrate(_ context.Context, t conversation.Thread, activeRun string, active []json.RawMessage, limit int, before string) (conversation.HydratePage, error) {
	var tr thread.Transcript
	if t != nil {
		tr = t.(*memThread).t.Transcript
	}
	msgs := tr.Messages
	if activeRun != "" {
		msgs = tr.Active(activeRun, active)
	}
	page, cursor := thread.Page(msgs, limit, before)
	if page == nil {
		page = []thread.Message{}
	}
	b, err := json.Marshal(page)
	if err != nil {
		return conversation.HydratePage{}, err
	}
	in, err := json.Marshal(tr.Interrupts)
	return conversation.HydratePage{Messages: b, Interrupts: in, Cursor: cursor}, err
}

func (m *memThreads) AgentMessages(_ context.Context, t conversation.Thread, runID string, earlier []conversation.RunEvents, posted []protocol.Message, budget int) ([]protocol.Message, conversation.Window, error) {
	tr := t.(*memThread).t.Transcript.Clone()
	var errs []error
	for _, r := range earlier {
		errs = append(errs, tr.FinishContext(r.RunID, r.Events))
	}
	input, w := thread.AgentInput(thread.AgentMessages(tr.Context(runID)), posted, budget)
	return input, conversation.Window(w), errors.Join(errs...)
}

// TestThreadsInMemory: the conversation's thread semantics on a Store and Threads in memory,
// without NATS: turns on both chat paths hydrate as their thread (TestHydrate's answer), a
// rejecting run is refused while a run of its thread streams and starts once its terminal is
// out, the thread is listed and deleted.
func TestThreadsInMemory(t *testing.T) {
	e := newEnv(t, envOptions{memory: true, memThreads: true})
	e.open(t, "/api/chat", http.MethodPost, threadFrame("T", "r1", script{Tokens: 3}, "u1", "hello"), nil).all()
	e.open(t, "/api/chat/ndjson", http.MethodPost, threadFrame("T", "r2", script{Tokens: 1}, "u1", "hello", "u2", "again"), nil).all()
	want := "u1 user: hello | m-r1-1 assistant: t1 t2 t3  | u2 user: again | m-r2-1 assistant: t1  | "
	h := e.hydrate(t, "/api/chat", "", "threadId", "T")
	if got := h.summary(); got != want || h.ActiveRun != nil || string(h.Interrupts) != "null" {
		t.Errorf("hydrate = %s\nwant messages %s", h.raw, want)
	}
	if got := e.hydrate(t, "/api/chat", "p2", "threadId", "T").raw; got != emptyThread {
		t.Errorf("another principal's thread: hydrate = %s, want %s", got, emptyThread)
	}

	a := dial(t, e.url(), "")
	a.send(threadFrame("T", "r3", script{Tokens: 60, IntervalMs: 20}, "u3", "third"))
	a.untilN(t, 4) // r3 is accepted, in its thread, and streams
	if h := e.hydrate(t, "/api/chat", "", "threadId", "T"); h.ActiveRun == nil || h.ActiveRun.RunID != "r3" {
		t.Errorf("hydrate while r3 streams: %s, want r3 active", h.raw)
	}
	b := dial(t, e.url(), "")
	b.send(withStrategy(threadFrame("T", "r4", script{Tokens: 1}, "u4", "fourth"), "reject"))
	if code, _ := bareError(t, b); code != conversation.CodeThreadBusy {
		t.Errorf("reject while r3 streams: %s, want %s", code, conversation.CodeThreadBusy)
	}
	if got := summary(a.untilTerminal()); !strings.HasSuffix(got, "RUN_FINISHED") {
		t.Fatalf("r3: %s", got)
	}
	b.send(withStrategy(threadFrame("T", "r5", script{Tokens: 2}, "u5", "fifth"), "reject"))
	if got := summary(b.untilTerminal()); got != tokenTurn(2) {
		t.Errorf("reject once r3's terminal is out: %s", got)
	}
	// What the thread holds, not where: r3's finish may land after r5's, and a hydrate
	// meanwhile shows r3 still active, its reply last (Transcript.Active: the client drops a
	// trailing assistant message when it joins the run, and rebuilds it from the replay).
	got := e.hydrate(t, "/api/chat", "", "threadId", "T").summary()
	if strings.Contains(got, "u4 user") {
		t.Errorf("the thread shows the refused message u4: %s", got)
	}
	for _, kept := range []string{"u3 user: third", "m-r3-1 assistant: t1 t2", "u5 user: fifth", "m-r5-1 assistant: t1 t2  | "} {
		if !strings.Contains(got, kept) {
			t.Errorf("the thread lacks %q: %s", kept, got)
		}
	}

	list := e.httpDo(t, http.MethodGet, "/api/threads", nil, nil)
	body, _ := io.ReadAll(list.Body)
	if list.StatusCode != http.StatusOK || !strings.Contains(string(body), `"threadId":"T"`) {
		t.Errorf("GET /api/threads = %d %s, want T listed", list.StatusCode, body)
	}
	if resp := e.httpDo(t, http.MethodDelete, "/api/threads/T", nil, nil); resp.StatusCode != http.StatusNoContent {
		t.Errorf("DELETE /api/threads/T = %d, want 204", resp.StatusCode)
	}
	if got := e.hydrate(t, "/api/chat", "", "threadId", "T").raw; got != emptyThread {
		t.Errorf("hydrate after the delete = %s, want %s", got, emptyThread)
	}
}
