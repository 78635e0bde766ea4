package threadstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/wsgateway/wsgateway/internal/testenv"
	"github.com/wsgateway/wsgateway/jetstream"
)

// turnInput is a run frame's input with one user message.
func turnInput(threadID, runID, userID, text string) json.RawMessage {
	return fmt.Appendf(nil, `{"threadId":%q,"runId":%q,"messages":[{"id":%q,"role":"user","content":%q}]}`,
		threadID, runID, userID, text)
}

// turnEvents is a run's log: an assistant message answering text, then RUN_FINISHED.
func turnEvents(threadID, runID, text string) []json.RawMessage {
	return []json.RawMessage{
		json.RawMessage(`{"type":"CUSTOM","name":"run.accepted"}`),
		json.RawMessage(fmt.Sprintf(`{"type":"RUN_STARTED","threadId":%q,"runId":%q}`, threadID, runID)),
		json.RawMessage(fmt.Sprintf(`{"type":"TEXT_MESSAGE_START","messageId":"a-%s","role":"assistant"}`, runID)),
		json.RawMessage(fmt.Sprintf(`{"type":"TEXT_MESSAGE_CONTENT","messageId":"a-%s","delta":"re: %s"}`, runID, text)),
		json.RawMessage(fmt.Sprintf(`{"type":"TEXT_MESSAGE_END","messageId":"a-%s"}`, runID)),
		json.RawMessage(fmt.Sprintf(`{"type":"RUN_FINISHED","threadId":%q,"runId":%q}`, threadID, runID)),
	}
}

// texts returns the thread's messages as "role:text" strings.
func texts(tb testing.TB, s *Store, t *Thread) map[string]string {
	tb.Helper()
	msgs, _, err := s.threadPage(context.Background(), t, t.Transcript.Messages, 0, "")
	if err != nil {
		tb.Fatal(err)
	}
	m := map[string]string{}
	for _, msg := range msgs {
		for _, p := range msg.Parts {
			if p.Type == "text" {
				m[msg.ID] = msg.Role + ":" + p.Content
			}
		}
	}
	return m
}

// TestThreadTwoGatewaysLoseNothing runs turns of one thread from two stores on one NATS
// server (two gateways) at once: every run and every message is in the thread afterwards,
// whether an update conflicted with the other store's, followed its own store's, or started
// from a stale read ahead.
func TestThreadTwoGatewaysLoseNothing(t *testing.T) {
	ns := testenv.StartNATS(t, server.Options{StoreDir: t.TempDir()})
	var stores []*Store
	for range 2 {
		cfg := testConfig(t)
		cfg.URLs = ns.ClientURL()
		stores = append(stores, openStore(t, cfg))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const perStore = 12
	var wg sync.WaitGroup
	errs := make(chan error, 2*perStore)
	for si, s := range stores {
		for i := range perStore {
			wg.Go(func() {
				runID := fmt.Sprintf("run-%d-%d", si, i)
				text := fmt.Sprintf("hello %d %d", si, i)
				// The thread read ahead, as a gateway reads it while it creates the run's
				// log: often stale by the time the run is accepted.
				input := turnInput("T", runID, "u-"+runID, text)
				ahead := s.ReadThreadAhead(ctx, "alice", "T")
				if _, err := s.AcceptRun(ctx, "alice", "T", runID, input, ahead, Overlap{}); err != nil {
					errs <- err
					return
				}
				if err := s.FinishRun(ctx, "alice", "T", runID, turnEvents("T", runID, text)); err != nil {
					errs <- err
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i, s := range stores {
		waitSealed(t, s)
		s.holdsMu.Lock()
		if n := len(s.holds); n != 0 {
			t.Errorf("store %d keeps %d thread holds after its updates ended", i, n)
		}
		s.holdsMu.Unlock()
	}
	th, err := stores[1].Thread(ctx, "alice", "T")
	if err != nil {
		t.Fatal(err)
	}
	got := texts(t, stores[1], th)
	runs, err := stores[1].AllRuns(ctx, th)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2*perStore || len(got) != 4*perStore {
		t.Fatalf("thread holds %d runs and %d messages, want %d and %d", len(runs), len(got), 2*perStore, 4*perStore)
	}
	for si := range stores {
		for i := range perStore {
			runID := fmt.Sprintf("run-%d-%d", si, i)
			text := fmt.Sprintf("hello %d %d", si, i)
			if got["u-"+runID] != "user:"+text || got["a-"+runID] != "assistant:re: "+text {
				t.Errorf("run %s: user %q, assistant %q", runID, got["u-"+runID], got["a-"+runID])
			}
		}
	}
	for _, r := range runs {
		if r.State != ThreadRunFinished {
			t.Errorf("run %s is %s, want finished", r.RunID, r.State)
		}
	}
	if th.ActiveRun() != "" {
		t.Errorf("ActiveRun = %q after every run finished", th.ActiveRun())
	}
}

// TestThreadPrincipals: a thread is its principal's only; the list is newest first; a delete
// removes the thread and its runs' logs.
func TestThreadPrincipals(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := s.runs.Create(ctx, "alice", "r1", "T1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AcceptRun(ctx, "alice", "T1", "r1", turnInput("T1", "r1", "u1", "first thread"), nil, Overlap{}); err != nil {
		t.Fatal(err)
	}
	var evs [][]byte
	for _, e := range turnEvents("T1", "r1", "first thread") {
		evs = append(evs, e)
	}
	mustAppend(t, w, evs)
	entries, _, err := s.runs.Snapshot(ctx, "alice", "r1")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.FinishRun(ctx, "alice", "T1", "r1", eventsOf(entries)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AcceptRun(ctx, "alice", "T2", "r2", turnInput("T2", "r2", "u2", "second thread"), nil, Overlap{}); err != nil {
		t.Fatal(err)
	}

	if _, err := s.Thread(ctx, "bob", "T1"); !errors.Is(err, ErrUnknownThread) {
		t.Errorf("bob's Thread(T1) = %v, want ErrUnknownThread", err)
	}
	if list, err := s.Threads(ctx, "bob"); err != nil || len(list) != 0 {
		t.Errorf("bob's Threads = %v, %v; want none", list, err)
	}
	if err := s.DeleteThread(ctx, "bob", "T1"); !errors.Is(err, ErrUnknownThread) {
		t.Errorf("bob's DeleteThread(T1) = %v, want ErrUnknownThread", err)
	}
	list, err := s.Threads(ctx, "alice")
	if err != nil || len(list) != 2 || list[0].ThreadID != "T2" || list[1].ThreadID != "T1" {
		t.Fatalf("alice's Threads = %+v, %v; want T2 then T1", list, err)
	}
	if list[0].Title != "second thread" || list[0].ActiveRun != "r2" || list[1].ActiveRun != "" {
		t.Errorf("alice's Threads = %+v", list)
	}

	if err := s.DeleteThread(ctx, "alice", "T1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Thread(ctx, "alice", "T1"); !errors.Is(err, ErrUnknownThread) {
		t.Errorf("Thread(T1) after delete = %v, want ErrUnknownThread", err)
	}
	if _, _, err := s.runs.Snapshot(ctx, "alice", "r1"); !errors.Is(err, jetstream.ErrUnknownRun) {
		t.Errorf("Snapshot(r1) after delete = %v, want ErrUnknownRun", err)
	}
	if list, err := s.Threads(ctx, "alice"); err != nil || len(list) != 1 || list[0].ThreadID != "T2" {
		t.Errorf("alice's Threads after delete = %+v, %v; want T2", list, err)
	}
}

// TestThreadReaped: a run whose gateway stopped while it ran is finished in its thread by the
// reaper of another gateway, with its producer_lost error.
func TestThreadReaped(t *testing.T) {
	ns := testenv.StartNATS(t, server.Options{StoreDir: t.TempDir()})
	cfg := testConfig(t)
	cfg.URLs = ns.ClientURL()
	a := openStore(t, cfg)
	cfg.ReapInterval = 200 * time.Millisecond
	b := openStore(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := a.runs.Create(ctx, "alice", "r1", "T")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.AcceptRun(ctx, "alice", "T", "r1", turnInput("T", "r1", "u1", "hi"), nil, Overlap{}); err != nil {
		t.Fatal(err)
	}
	evs := turnEvents("T", "r1", "hi")
	mustAppend(t, w, [][]byte{evs[0], evs[1], evs[2], evs[3]})
	a.Close() // the gateway stops mid-run: its lease is released, the log left open
	a.runs.Close()
	for {
		th, err := b.Thread(ctx, "alice", "T")
		if err != nil {
			t.Fatal(err)
		}
		if r := th.Runs[0]; r.State != ThreadRunRunning {
			if r.State != ThreadRunError || r.Code != "producer_lost" {
				t.Fatalf("reaped run = %+v, want error producer_lost", r)
			}
			if got := texts(t, b, th); got["a-r1"] != "assistant:re: hi" {
				t.Fatalf("reaped thread's messages = %v, want the partial reply", got)
			}
			return
		}
		if ctx.Err() != nil {
			t.Fatal("the reaper did not finish the thread")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestThreadKeptValue: what a store wrote of a thread is taken by its next update or read
// ahead instead of decoded again, but only while it is the thread's value: after another
// store's write, a read ahead decodes that write, and the next update loses nothing. Nothing
// is kept longer than keptFor.
func TestThreadKeptValue(t *testing.T) {
	ns := testenv.StartNATS(t, server.Options{StoreDir: t.TempDir()})
	var a, b *Store
	for _, s := range []**Store{&a, &b} {
		cfg := testConfig(t)
		cfg.URLs = ns.ClientURL()
		*s = openStore(t, cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	turn := func(s *Store, runID string) {
		t.Helper()
		ahead := s.ReadThreadAhead(ctx, "alice", "T")
		if _, err := s.AcceptRun(ctx, "alice", "T", runID, turnInput("T", runID, "u-"+runID, runID), ahead, Overlap{}); err != nil {
			t.Fatal(err)
		}
		if err := s.FinishRun(ctx, "alice", "T", runID, turnEvents("T", runID, runID)); err != nil {
			t.Fatal(err)
		}
	}
	key := threadKey("alice", "T")
	kept := func(s *Store) *threadRead {
		s.kept.mu.Lock()
		defer s.kept.mu.Unlock()
		return s.kept.by[key].r
	}
	turn(a, "r1")
	k := kept(a)
	if k == nil {
		t.Fatal("store a keeps nothing of the thread it wrote")
	}
	ahead := a.ReadThreadAhead(ctx, "alice", "T")
	r, err := ahead.read(ctx)
	if err != nil || r != k {
		t.Errorf("the read ahead after the store's own write decoded the thread again (err %v)", err)
	}
	if kept(a) != nil {
		t.Error("what was taken is still kept")
	}
	stale := r
	a.kept.keep(key, stale) // as if the read ahead's update had not come

	turn(b, "r2") // another gateway writes the thread: what a kept is stale
	ahead = a.ReadThreadAhead(ctx, "alice", "T")
	if r, err = ahead.read(ctx); err != nil || r == stale {
		t.Errorf("a read ahead after another store's write took the stale value (err %v)", err)
	}
	turn(a, "r3")
	th, err := b.Thread(ctx, "alice", "T")
	if err != nil {
		t.Fatal(err)
	}
	got := texts(t, b, th)
	if len(th.Runs) != 3 || len(got) != 6 {
		t.Fatalf("thread holds %d runs and %d messages (%v), want 3 and 6: an update started from a stale value", len(th.Runs), len(got), got)
	}
	for _, r := range []string{"r1", "r2", "r3"} {
		if got["u-"+r] != "user:"+r || got["a-"+r] != "assistant:re: "+r {
			t.Errorf("run %s: user %q, assistant %q", r, got["u-"+r], got["a-"+r])
		}
	}
	// A read ahead made before the store's own next write (a run frame that came as the
	// thread's previous run finished) starts from what that write kept, decoding nothing.
	ahead = a.ReadThreadAhead(ctx, "alice", "T")
	<-ahead.done
	if _, err := a.AcceptRun(ctx, "alice", "T", "r4", turnInput("T", "r4", "u-r4", "r4"), nil, Overlap{}); err != nil {
		t.Fatal(err)
	}
	if k = kept(a); k == nil {
		t.Fatal("store a keeps nothing of the thread it wrote")
	}
	if r, err = ahead.read(ctx); err != nil || r != k {
		t.Errorf("a read ahead of the store's own write did not start from what the write kept (err %v)", err)
	}
	time.Sleep(ThreadsKeptFor + 100*time.Millisecond)
	for i, s := range []*Store{a, b} {
		s.kept.mu.Lock()
		if n, size := len(s.kept.by), s.kept.size; n != 0 || size != 0 {
			t.Errorf("store %d keeps %d values (%d bytes) %v after its last write", i, n, size, 2*keptFor)
		}
		s.kept.mu.Unlock()
	}
}

// startThread accepts the first run of alice's thread id, which creates the thread.
func startThread(ctx context.Context, s *Store, id string) error {
	_, err := s.AcceptRun(ctx, "alice", id, "r"+id, turnInput(id, "r"+id, "ur"+id, "hello"), s.ReadThreadAhead(ctx, "alice", id), Overlap{})
	return err
}

// TestThreadCountKept: runs that start threads of one principal at once count its threads
// with one request, and the store's own creations and deletions keep the bound exact.
func TestThreadCountKept(t *testing.T) {
	cfg := testConfig(t)
	cfg.Threads.MaxThreadsPerPrincipal = 25
	s := openStore(t, cfg)
	ctx := context.Background()
	start := func(i int) error { return startThread(ctx, s, fmt.Sprintf("T%d", i)) }
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			if err := start(i); err != nil {
				t.Errorf("thread %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	s.counts.mu.Lock()
	asked := s.counts.asked
	s.counts.mu.Unlock()
	if asked != 1 {
		t.Errorf("20 new threads at once asked the stream for the count %d times, want 1", asked)
	}
	for i := 20; i < 25; i++ {
		if err := start(i); err != nil {
			t.Fatalf("thread %d of 25: %v", i, err)
		}
	}
	if err := start(25); !errors.Is(err, ErrThreadLimit) {
		t.Fatalf("a 26th thread: %v, want ErrThreadLimit", err)
	}
	if err := s.DeleteThread(ctx, "alice", "T0"); err != nil {
		t.Fatal(err)
	}
	if err := start(25); err != nil {
		t.Fatalf("a thread after a delete: %v", err)
	}
}

// TestAcceptRunAlone: a run accepted alone (multitaskStrategy reject) is refused with the
// thread's active run while that run has not ended, and leaves the thread as it was; once the
// active run's terminal is stored (before its finish lands in the thread), it is accepted.
func TestAcceptRunAlone(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := s.AcceptRun(ctx, "alice", "T", "r1", turnInput("T", "r1", "u1", "hi"), nil, Overlap{}); err != nil {
		t.Fatal(err)
	}
	ended := false
	asked := ""
	alone := func(_ context.Context, runID string) (bool, error) { asked = runID; return ended, nil }
	_, err := s.AcceptRun(ctx, "alice", "T", "r2", turnInput("T", "r2", "u2", "again"), nil, Overlap{Ended: alone})
	var busy *BusyError
	if !errors.As(err, &busy) || busy.ActiveRun != "r1" || !errors.Is(err, ErrThreadBusy) || asked != "r1" {
		t.Fatalf("AcceptRun beside a running run = %v (asked %q), want BusyError r1", err, asked)
	}
	th, err := s.Thread(ctx, "alice", "T")
	if err != nil || len(th.Runs) != 1 || len(th.Transcript.Messages) != 1 {
		t.Fatalf("thread after the refusal = %+v, %v; want r1 alone", th, err)
	}
	if _, err := s.AcceptRun(ctx, "alice", "T", "r1", turnInput("T", "r1", "u1", "hi"), nil, Overlap{Ended: alone}); err != nil {
		t.Errorf("a resubmit of the active run refused: %v", err)
	}
	ended = true
	if _, err := s.AcceptRun(ctx, "alice", "T", "r2", turnInput("T", "r2", "u2", "again"), nil, Overlap{Ended: alone}); err != nil {
		t.Fatalf("AcceptRun once r1 ended = %v", err)
	}
}

// TestAcceptRunQueued: a run queued behind an active run (Overlap.Queue) is in the thread,
// queued, with its input outside the transcript; accepting it again changes nothing while an
// earlier run is active, and starts it (its input merged) once none is. Runs queue in order
// of acceptance, at most MaxQueued; a queued run that ends before it starts (aborted) is
// recorded ended, and no longer holds the later ones back.
func TestAcceptRunQueued(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ended := map[string]bool{}
	queue := Overlap{Ended: func(_ context.Context, runID string) (bool, error) { return ended[runID], nil }, Queue: true}
	accept := func(runID, text string) *Thread {
		t.Helper()
		th, err := s.AcceptRun(ctx, "alice", "T", runID, turnInput("T", runID, "u-"+runID, text), nil, queue)
		if err != nil {
			t.Fatalf("AcceptRun %s: %v", runID, err)
		}
		return th
	}
	accept("r1", "first")
	if th := accept("r2", "second"); th.RunState("r2") != ThreadRunQueued || th.Ahead("r2") != 1 || len(th.Transcript.Messages) != 1 {
		t.Fatalf("r2 beside a running r1: state %q, %d ahead, %d messages; want queued, 1, 1", th.RunState("r2"), th.Ahead("r2"), len(th.Transcript.Messages))
	}
	if th := accept("r3", "third"); th.RunState("r3") != ThreadRunQueued || th.Ahead("r3") != 2 {
		t.Fatalf("r3: state %q, %d ahead; want queued, 2", th.RunState("r3"), th.Ahead("r3"))
	}
	if th := accept("r3", "third"); th.RunState("r3") != ThreadRunQueued {
		t.Fatalf("r3 accepted again before r1 ended: %q", th.RunState("r3"))
	}
	ended["r1"] = true
	if th := accept("r3", "third"); th.RunState("r3") != ThreadRunQueued {
		t.Fatalf("r3 started before r2, queued ahead of it: %q", th.RunState("r3"))
	}
	if th := accept("r2", "second"); th.RunState("r2") != ThreadRunRunning || len(th.Transcript.Messages) != 2 {
		t.Fatalf("r2 once r1 ended: state %q, %d messages; want running, 2", th.RunState("r2"), len(th.Transcript.Messages))
	}
	// r4 queues behind r2 and r3; r3 is aborted while queued.
	accept("r4", "fourth")
	aborted := []json.RawMessage{json.RawMessage(`{"type":"RUN_ERROR","message":"aborted","code":"aborted"}`)}
	if err := s.FinishRun(ctx, "alice", "T", "r3", aborted); err != nil {
		t.Fatal(err)
	}
	ended["r2"] = true
	th := accept("r4", "fourth")
	if th.RunState("r3") != ThreadRunError || th.RunState("r4") != ThreadRunRunning {
		t.Fatalf("after r3's abort and r2's end: r3 %q, r4 %q; want error, running", th.RunState("r3"), th.RunState("r4"))
	}
	for _, m := range th.Transcript.Messages {
		if m.ID == "u-r3" {
			t.Fatalf("the aborted queued run's message is in the transcript")
		}
	}
	// The queue's bound.
	for i := range MaxQueued {
		accept(fmt.Sprintf("q%d", i), "queued")
	}
	_, err := s.AcceptRun(ctx, "alice", "T", "over", turnInput("T", "over", "u-over", "over"), nil, queue)
	var busy *BusyError
	if !errors.As(err, &busy) {
		t.Fatalf("AcceptRun beyond MaxQueued = %v, want a BusyError", err)
	}
}

// TestAcceptRunRollback: a run queued with Overlap.Rollback takes the runs running before it
// out of the transcript when they end with RUN_ERROR (their messages, their partial reply),
// whether their finish lands before it starts or not; a run that finished before the
// rollback reached it keeps its reply.
func TestAcceptRunRollback(t *testing.T) {
	for _, tc := range []struct {
		name        string
		end         string // r1's terminal
		finishFirst bool   // r1's finish lands before r2 starts
		want        string
		keeps       bool // r1's messages stay
	}{
		{"interrupted, finish first", `{"type":"RUN_ERROR","message":"interrupted","code":"interrupted"}`, true, "u-r0 a-r0 u-r2", false},
		{"interrupted, finish after", `{"type":"RUN_ERROR","message":"interrupted","code":"interrupted"}`, false, "u-r0 a-r0 u-r2", false},
		{"finished before the rollback", `{"type":"RUN_FINISHED","threadId":"T","runId":"r1"}`, true, "u-r0 a-r0 u-r1 a-r1 u-r2", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t, testConfig(t))
			ctx := context.Background()
			runTurn(t, s, "T", "r0", string(turnInput("T", "r0", "u-r0", "zero")), "zero")
			w, err := s.runs.Create(ctx, "alice", "r1", "T")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { w.Close(context.Background()) })
			events := append(turnEvents("T", "r1", "one")[:4], json.RawMessage(tc.end))
			var raw [][]byte
			for _, e := range events {
				raw = append(raw, e)
			}
			ended := map[string]bool{}
			rollback := Overlap{Ended: func(_ context.Context, runID string) (bool, error) { return ended[runID], nil }, Queue: true, Rollback: true}
			if _, err := s.AcceptRun(ctx, "alice", "T", "r1", turnInput("T", "r1", "u-r1", "one"), nil, Overlap{}); err != nil {
				t.Fatal(err)
			}
			// r2 posts r1's message again, as a client posting the whole transcript does.
			r2 := json.RawMessage(`{"messages":[{"id":"u-r1","role":"user","content":"one"},{"id":"u-r2","role":"user","content":"two"}]}`)
			if th, err := s.AcceptRun(ctx, "alice", "T", "r2", r2, nil, rollback); err != nil || th.RunState("r2") != ThreadRunQueued {
				t.Fatalf("r2 beside a running r1: %v, want queued", err)
			}
			mustAppend(t, w, raw)
			ended["r1"] = true
			if tc.finishFirst {
				if err := s.FinishRun(ctx, "alice", "T", "r1", events); err != nil {
					t.Fatal(err)
				}
			}
			th, err := s.AcceptRun(ctx, "alice", "T", "r2", r2, nil, rollback)
			if err != nil || th.RunState("r2") != ThreadRunRunning {
				t.Fatalf("r2 once r1 ended: %v, state %q", err, th.RunState("r2"))
			}
			if !tc.finishFirst {
				if err := s.FinishRun(ctx, "alice", "T", "r1", events); err != nil { // late: changes nothing
					t.Fatal(err)
				}
			}
			if got := strings.Join(pageAll(t, s, "T", 0), " "); got != tc.want {
				t.Fatalf("the thread shows %s, want %s", got, tc.want)
			}
			// A rolled back run that started the thread leaves no title behind.
			s2 := "T2-" + strings.ReplaceAll(tc.name, " ", "-")
			if _, err := s.AcceptRun(ctx, "alice", s2, "r1", turnInput(s2, "r1", "u-r1", "one"), nil, Overlap{}); err != nil {
				t.Fatal(err)
			}
			running := Overlap{Ended: func(context.Context, string) (bool, error) { return false, nil }, Queue: true, Rollback: true}
			if th, err := s.AcceptRun(ctx, "alice", s2, "r9", turnInput(s2, "r9", "u-r9", "nine"), nil, running); err != nil || th.RunState("r9") != ThreadRunQueued {
				t.Fatalf("r9 beside a running r1: %v, want queued", err)
			}
			if err := s.FinishRun(ctx, "alice", s2, "r1", events); err != nil {
				t.Fatal(err)
			}
			if th, _ := s.Thread(ctx, "alice", s2); (th.Title == "one") != tc.keeps {
				t.Errorf("after r1 %s, the thread's title is %q", tc.name, th.Title)
			}
		})
	}
}

// TestAcceptRunQueuedResubmit: a run aborted while queued and sent again (its runId
// resubmitted) is queued again in its one entry of the thread, starts once the run before it
// ended, and the thread takes runs after it: with a second entry, left queued for ever, every
// later run of the thread waited behind it.
func TestAcceptRunQueuedResubmit(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ended := map[string]bool{}
	queue := Overlap{Ended: func(_ context.Context, runID string) (bool, error) { return ended[runID], nil }, Queue: true}
	accept := func(runID string) *Thread {
		t.Helper()
		th, err := s.AcceptRun(ctx, "alice", "T", runID, turnInput("T", runID, "u-"+runID, runID), nil, queue)
		if err != nil {
			t.Fatalf("AcceptRun %s: %v", runID, err)
		}
		return th
	}
	finish := func(runID string, events []json.RawMessage) {
		t.Helper()
		if err := s.FinishRun(ctx, "alice", "T", runID, events); err != nil {
			t.Fatalf("FinishRun %s: %v", runID, err)
		}
		ended[runID] = true
	}
	accept("r1")
	accept("r2")
	finish("r2", []json.RawMessage{json.RawMessage(`{"type":"RUN_ERROR","message":"aborted","code":"aborted"}`)})
	ended["r2"] = false // sent again
	if th := accept("r2"); th.RunState("r2") != ThreadRunQueued || len(th.Runs) != 2 {
		t.Fatalf("r2 sent again behind a running r1: state %q, runs %+v; want queued, r1 and r2", th.RunState("r2"), th.Runs)
	}
	finish("r1", turnEvents("T", "r1", "r1"))
	if th := accept("r2"); th.RunState("r2") != ThreadRunRunning {
		t.Fatalf("r2 once r1 ended: %q, want running", th.RunState("r2"))
	}
	finish("r2", turnEvents("T", "r2", "r2"))
	if th := accept("r3"); th.RunState("r3") != ThreadRunRunning || len(th.Runs) != 3 {
		t.Fatalf("r3 once r1 and r2 ended: state %q, runs %+v; want running, three runs", th.RunState("r3"), th.Runs)
	}
}

// TestThreadCountDuringCount: a thread this store creates while it asks the stream for the
// count, and which the count's answer holds already, is counted once: the principal may still
// create its last threads.
func TestThreadCountDuringCount(t *testing.T) {
	cfg := testConfig(t)
	cfg.Threads.MaxThreadsPerPrincipal = 3
	s := openStore(t, cfg)
	ctx := context.Background()
	start := func(id string) error { return startThread(ctx, s, id) }
	if err := start("T0"); err != nil {
		t.Fatal(err)
	}
	// The count is stale; as it is asked again, a thread of alice's lands and this store
	// counts its creation.
	s.counts.mu.Lock()
	s.counts.m["alice"].at = time.Now().Add(-2 * countFresh)
	s.counts.mu.Unlock()
	countHook = func(principal string) {
		if _, err := s.threads.Put(ctx, threadKey(principal, "T1"), []byte("{}")); err != nil {
			t.Error(err)
		}
		s.counted(principal, 1)
	}
	t.Cleanup(func() { countHook = nil })
	if err := start("T2"); err != nil {
		t.Fatalf("the third of 3 threads: %v", err)
	}
	countHook = nil
	if err := start("T3"); !errors.Is(err, ErrThreadLimit) {
		t.Fatalf("a fourth thread: %v, want ErrThreadLimit", err)
	}
}
