package threadstore

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/thread"
)

// waitSealed waits until the store's seals in the background are done.
func waitSealed(tb testing.TB, s *Store) {
	tb.Helper()
	for deadline := time.Now().Add(10 * time.Second); s.sealing.Load() > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatal("the seals in the background did not end")
		}
	}
}

// longThread runs turns one after the other on the principal's thread T, each run posting
// what post returns, and returns the ids of the thread's messages in order.
func longThread(t testing.TB, s *Store, threadID string, from, turns int, post func(k int, ids []string) []string) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for k := from; k < from+turns; k++ {
		runID := fmt.Sprintf("r%d", k)
		ids = append(ids, "u"+runID)
		posted := post(k, ids)
		var msgs []string
		for _, id := range posted {
			role, text := "user", "question "+strings.TrimPrefix(id, "ur")
			if strings.HasPrefix(id, "a-") {
				role, text = "assistant", "re: question "+strings.TrimPrefix(id, "a-r")
			}
			msgs = append(msgs, fmt.Sprintf(`{"id":%q,"role":%q,"content":%q}`, id, role, text))
		}
		input := fmt.Appendf(nil, `{"threadId":%q,"runId":%q,"messages":[%s]}`, threadID, runID, strings.Join(msgs, ","))
		if _, err := s.AcceptRun(ctx, "alice", threadID, runID, input, s.ReadThreadAhead(ctx, "alice", threadID), Overlap{}); err != nil {
			t.Fatalf("turn %d: %v", k, err)
		}
		if err := s.FinishRun(ctx, "alice", threadID, runID, turnEvents(threadID, runID, fmt.Sprintf("question %d", k))); err != nil {
			t.Fatalf("turn %d: %v", k, err)
		}
		waitSealed(t, s)
		ids = append(ids, "a-"+runID)
	}
	return ids
}

// pageAll pages the thread back, limit messages a page, and returns the ids in order.
func pageAll(t testing.TB, s *Store, threadID string, limit int) []string {
	t.Helper()
	ctx := context.Background()
	th, err := s.Thread(ctx, "alice", threadID)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for before, pages := "", 0; ; pages++ {
		window, cursor, err := s.threadPage(ctx, th, th.Transcript.Messages, limit, before)
		if err != nil {
			t.Fatal(err)
		}
		if limit > 0 && (len(window) == 0 || len(window) > limit || cursor != "" && len(window) != limit) {
			t.Fatalf("page %d before %q: %d messages, cursor %q (limit %d)", pages, before, len(window), cursor, limit)
		}
		var page []string
		for _, m := range window {
			page = append(page, m.ID)
		}
		ids = append(page, ids...)
		if cursor == "" {
			return ids
		}
		before = cursor
	}
}

// TestThreadLog: a long thread keeps a bounded value (the head and its newest messages),
// every message in records, and pages back whole from the newest page, whatever the page's
// size; its agent's context reads the newest records.
func TestThreadLog(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx := context.Background()
	const turns = 100
	want := longThread(t, s, "T", 0, turns, func(k int, ids []string) []string { return ids[len(ids)-1:] })
	th, err := s.Thread(ctx, "alice", "T")
	if err != nil {
		t.Fatal(err)
	}
	// Every turn settled: the head holds no message, its newest records and runs only.
	if th.Sealed == nil || len(th.Transcript.Messages) != 0 || th.Sealed.Count != 2*turns || len(th.Sealed.Recent) >= segmentSize {
		t.Fatalf("hot tail %d messages, sealed %+v: want none hot, %d sealed", len(th.Transcript.Messages), th.Sealed, 2*turns)
	}
	if len(th.Runs) != keepRuns {
		t.Errorf("the head keeps %d runs, want %d", len(th.Runs), keepRuns)
	}
	for _, limit := range []int{1, 7, 16, 50, 500} {
		if got := pageAll(t, s, "T", limit); !slices.Equal(got, want) {
			t.Fatalf("paged by %d: %d messages %v…, want %d %v…", limit, len(got), got[:min(6, len(got))], len(want), want[:6])
		}
	}
	all := texts(t, s, th)
	for k := range turns {
		if u, a := all[fmt.Sprintf("ur%d", k)], all[fmt.Sprintf("a-r%d", k)]; u != fmt.Sprintf("user:question %d", k) || a != fmt.Sprintf("assistant:re: question %d", k) {
			t.Fatalf("turn %d: %q, %q", k, u, a)
		}
	}

	// A cursor issued while its message was in the hot tail (a run's, while it ran), which
	// the run's finish sealed.
	if _, err := s.AcceptRun(ctx, "alice", "T", "rx", turnInput("T", "rx", "urx", "question x"), nil, Overlap{}); err != nil {
		t.Fatal(err)
	}
	if th, err = s.Thread(ctx, "alice", "T"); err != nil {
		t.Fatal(err)
	}
	window, cursor, err := s.threadPage(ctx, th, th.Transcript.Messages, 1, "")
	if err != nil || cursor != "urx" || len(window) != 1 || window[0].ID != "urx" {
		t.Fatalf("newest page of 1 while rx runs: %v, cursor %q, err %v", ids(window), cursor, err)
	}
	if err := s.FinishRun(ctx, "alice", "T", "rx", turnEvents("T", "rx", "question x")); err != nil {
		t.Fatal(err)
	}
	waitSealed(t, s)
	if th, err = s.Thread(ctx, "alice", "T"); err != nil || len(th.Transcript.Messages) != 0 {
		t.Fatalf("after rx: %d hot messages, %v", len(th.Transcript.Messages), err)
	}
	older, _, err := s.threadPage(ctx, th, th.Transcript.Messages, 5, cursor)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(older); !slices.Equal(got, want[len(want)-5:]) {
		t.Fatalf("page before the sealed %s: %v, want %v", cursor, got, want[len(want)-5:])
	}
	want = append(want, "urx", "a-rx")

	// The agent's context: the newest sealed messages, at least the budget's bytes, as
	// thread.AgentMessages converts them, the second time as the first.
	msgs, err := s.sealedAgentMessages(ctx, th, 2000)
	if err != nil {
		t.Fatal(err)
	}
	whole, err := s.sealedAgentMessages(ctx, th, 0)
	if err != nil || len(whole) != th.Sealed.Count {
		t.Fatalf("sealedAgentMessages(0): %d messages, want %d (%v)", len(whole), th.Sealed.Count, err)
	}
	if len(msgs) < 5 || len(msgs) == th.Sealed.Count || msgs[len(msgs)-1].ID != want[th.Sealed.Count-1] || !reflect.DeepEqual(msgs, whole[len(whole)-len(msgs):]) {
		t.Fatalf("sealedAgentMessages(2000): %d messages, last %s; not the newest of all %d", len(msgs), msgs[len(msgs)-1].ID, len(whole))
	}
	sealed, err := s.sealedRange(ctx, threadKey("alice", "T"), th.Sealed, nil, 0, th.Sealed.Count)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := s.sealedAgentMessages(ctx, th, 0); !reflect.DeepEqual(again, thread.AgentMessages(sealed)) || !reflect.DeepEqual(again, whole) {
		t.Fatalf("sealedAgentMessages(0) again: not thread.AgentMessages of the sealed messages")
	}
}

// TestThreadReplyWrittenOnce: a turn writes its reply into the thread store once (its
// record), however long the thread, and the head that follows holds none of it.
func TestThreadReplyWrittenOnce(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx := context.Background()
	longThread(t, s, "T", 0, 20, func(k int, ids []string) []string { return ids[len(ids)-1:] })
	text := strings.Repeat("a long reply ", 5000) // 65,000 bytes
	before := s.ThreadBytesWritten()
	if _, err := s.AcceptRun(ctx, "alice", "T", "big", turnInput("T", "big", "ubig", "question"), nil, Overlap{}); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishRun(ctx, "alice", "T", "big", turnEvents("T", "big", text)); err != nil {
		t.Fatal(err)
	}
	waitSealed(t, s)
	written := s.ThreadBytesWritten() - before
	if ratio := float64(written) / float64(len(text)); ratio > 1.25 {
		t.Errorf("the turn wrote %d bytes to the thread store for a reply of %d: %.2f times it, want at most 1.25", written, len(text), ratio)
	}
	th, err := s.Thread(ctx, "alice", "T")
	if err != nil {
		t.Fatal(err)
	}
	if len(th.Transcript.Messages) != 0 || th.Sealed.Count != 42 {
		t.Fatalf("after the turn: %d messages in the head, %d sealed; want 0 and 42", len(th.Transcript.Messages), th.Sealed.Count)
	}
	if got := texts(t, s, th)["a-big"]; got != "assistant:re: "+text {
		t.Fatalf("the reply reads back as %d bytes, want %d", len(got), len("assistant:re: "+text))
	}
}

func ids(msgs []thread.Message) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, m.ID)
	}
	return out
}

// TestThreadLogPosted: whatever a run posts of a long thread (the whole transcript, a stale
// copy of it that ends in the sealed messages, a regenerate from a sealed message), no
// message is added twice; a regenerate cuts what followed, as it does in a short thread.
func TestThreadLogPosted(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx := context.Background()
	// Each run posts the whole transcript, as a client without a page size does.
	want := longThread(t, s, "T", 0, 60, func(k int, ids []string) []string { return ids })
	if got := pageAll(t, s, "T", 0); !slices.Equal(got, want) {
		t.Fatalf("whole transcript posted: %d messages, want %d", len(got), len(want))
	}
	// A second device that saw the thread 40 turns ago posts that and its new message.
	stale := want[:2*20]
	longThread(t, s, "T", 60, 1, func(k int, ids []string) []string { return append(slices.Clone(stale), ids[len(ids)-1]) })
	want = turnIDs(61)
	got := pageAll(t, s, "T", 0)
	if len(got) != 2*61 || !slices.Equal(got, want) {
		t.Fatalf("stale copy posted: %d messages, want %d", len(got), 2*61)
	}
	if dup := duplicates(got); dup != "" {
		t.Fatalf("message %s twice", dup)
	}
	// A regenerate from a sealed user message: the list ends at ur10.
	th, _ := s.Thread(ctx, "alice", "T")
	if th.Sealed == nil || th.Sealed.Count < 22 {
		t.Fatalf("sealed %+v, want ur10 sealed", th.Sealed)
	}
	input := fmt.Appendf(nil, `{"threadId":"T","runId":"regen","messages":[{"id":"ur9","role":"user","content":"question 9"},`+
		`{"id":"a-r9","role":"assistant","content":"re: question 9"},{"id":"ur10","role":"user","content":"question 10"}]}`)
	if _, err := s.AcceptRun(ctx, "alice", "T", "regen", input, nil, Overlap{}); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishRun(ctx, "alice", "T", "regen", turnEvents("T", "regen", "question 10")); err != nil {
		t.Fatal(err)
	}
	waitSealed(t, s)
	got = pageAll(t, s, "T", 9)
	if wantRegen := append(turnIDs(11)[:21], "a-regen"); !slices.Equal(got, wantRegen) {
		t.Fatalf("after a regenerate from ur10: %v, want %v", got, wantRegen)
	}
}

// turnIDs returns the ids of the messages of turns 0 to n-1 of longThread.
func turnIDs(n int) []string {
	var want []string
	for k := range n {
		want = append(want, fmt.Sprintf("ur%d", k), fmt.Sprintf("a-r%d", k))
	}
	return want
}

func duplicates(ids []string) string {
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] {
			return id
		}
		seen[id] = true
	}
	return ""
}

// TestThreadUpgrade: threads written in the format before records (one value each, the
// whole transcript in it, no header; a large one in parts) read, list, page and take new
// turns as they did, every message kept.
func TestThreadUpgrade(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx := context.Background()
	var msgs []string
	var runs []string
	for k := range 40 {
		msgs = append(msgs, fmt.Sprintf(`{"id":"ur%d","role":"user","parts":[{"type":"text","content":"question %d"}]}`, k, k),
			fmt.Sprintf(`{"id":"a-r%d","role":"assistant","parts":[{"type":"text","content":"re: question %d"}]}`, k, k))
		runs = append(runs, fmt.Sprintf(`{"runId":"r%d","state":"finished","started":"2026-12-01T10:00:00Z","ended":"2026-12-01T10:00:01Z"}`, k))
	}
	// Exactly as the gateway before records wrote it (TestThreadValueFormat's fields).
	old := `{"principal":"alice","threadId":"T","title":"question 0","created":"2026-12-01T10:00:00Z",` +
		`"updated":"2026-12-01T10:00:01Z","runs":[` + strings.Join(runs, ",") + `],"transcript":{"messages":[` + strings.Join(msgs, ",") + `]}}`
	if _, err := s.threads.Put(ctx, threadKey("alice", "T"), []byte(old)); err != nil {
		t.Fatal(err)
	}
	list, err := s.Threads(ctx, "alice")
	if err != nil || len(list) != 1 || list[0].ThreadID != "T" || list[0].Title != "question 0" {
		t.Fatalf("Threads = %+v, %v", list, err)
	}
	want := turnIDs(40)
	if got := pageAll(t, s, "T", 30); !slices.Equal(got, want) {
		t.Fatalf("old value paged: %v", got)
	}
	longThread(t, s, "T", 40, 1, func(k int, ids []string) []string { return ids[len(ids)-1:] })
	want = turnIDs(41)
	th, err := s.Thread(ctx, "alice", "T")
	if err != nil || th.Sealed == nil {
		t.Fatalf("after a turn: sealed %v, %v; want the settled messages sealed", th, err)
	}
	if got := pageAll(t, s, "T", 30); !slices.Equal(got, want) {
		t.Fatalf("after a turn: %v, want %v", got, want)
	}
	if _, read, err := s.threadsRead(ctx, "alice"); err != nil || read > 1024 {
		t.Fatalf("the list read %d bytes (%v), want only the header", read, err)
	}
}

// longThreads gives alice n threads "T0" to "T<n-1>", in that order, each of three turns
// whose questions and replies are 20 KB, and returns that text.
func longThreads(tb testing.TB, s *Store, n int) string {
	tb.Helper()
	ctx := context.Background()
	long := strings.Repeat("x", 20000)
	for i := range n {
		id := fmt.Sprintf("T%d", i)
		for k := range 3 {
			runID := fmt.Sprintf("%s-r%d", id, k)
			if _, err := s.AcceptRun(ctx, "alice", id, runID, turnInput(id, runID, "u-"+runID, long), nil, Overlap{}); err != nil {
				tb.Fatal(err)
			}
			if err := s.FinishRun(ctx, "alice", id, runID, turnEvents(id, runID, long)); err != nil {
				tb.Fatal(err)
			}
		}
	}
	return long
}

// TestThreadListReadsHeads: listing a principal's long threads reads their heads' headers,
// not their transcripts.
func TestThreadListReadsHeads(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx := context.Background()
	const threads = 20
	long := longThreads(t, s, threads)
	list, read, err := s.threadsRead(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("listed %d threads of 120 KB each reading %d bytes", len(list), read)
	if len(list) != threads || list[0].ThreadID != fmt.Sprintf("T%d", threads-1) || list[0].Title != long[:80] {
		t.Fatalf("list: %d threads, first %+v", len(list), list[0])
	}
	if read > threads*512 {
		t.Fatalf("the list read %d bytes for %d threads, want headers only", read, threads)
	}
	if other, err := s.Threads(ctx, "bob"); err != nil || len(other) != 0 {
		t.Fatalf("bob's list: %v, %v", other, err)
	}
}

// TestThreadRecordsRefreshed: a thread in use keeps its oldest messages past the bucket's
// TTL: its records are written again before they expire.
func TestThreadRecordsRefreshed(t *testing.T) {
	cfg := testConfig(t)
	cfg.Threads.Retention = 4 * time.Second
	s := openStore(t, cfg)
	turns := 0
	for deadline := time.Now().Add(7 * time.Second); time.Now().Before(deadline); turns += 10 {
		longThread(t, s, "T", turns, 10, func(k int, ids []string) []string { return ids[len(ids)-1:] })
		time.Sleep(500 * time.Millisecond)
	}
	if got := pageAll(t, s, "T", 100); !slices.Equal(got, turnIDs(turns)) {
		t.Fatalf("after 7 s of turns with a 4 s retention: %d messages from %v, want %d", len(got), got[:min(4, len(got))], 2*turns)
	}
}

// TestThreadLogSnapshot: a run whose events hold a MESSAGES_SNAPSHOT replaces the whole
// list, its sealed messages included, as the client's processor does.
func TestThreadLogSnapshot(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx := context.Background()
	longThread(t, s, "T", 0, 10, func(k int, ids []string) []string { return ids[len(ids)-1:] })
	if _, err := s.AcceptRun(ctx, "alice", "T", "snap", turnInput("T", "snap", "u-snap", "again"), nil, Overlap{}); err != nil {
		t.Fatal(err)
	}
	events := []json.RawMessage{
		json.RawMessage(`{"type":"CUSTOM","name":"run.accepted"}`),
		json.RawMessage(`{"type":"RUN_STARTED","threadId":"T","runId":"snap"}`),
		json.RawMessage(`{"type":"MESSAGES_SNAPSHOT","messages":[{"id":"ur0","role":"user","content":"question 0"},` +
			`{"id":"a-snap","role":"assistant","content":"all over again"}]}`),
		json.RawMessage(`{"type":"RUN_FINISHED","threadId":"T","runId":"snap"}`),
	}
	if err := s.FinishRun(ctx, "alice", "T", "snap", events); err != nil {
		t.Fatal(err)
	}
	waitSealed(t, s)
	if got := pageAll(t, s, "T", 3); !slices.Equal(got, []string{"ur0", "a-snap"}) {
		t.Fatalf("after a snapshot: %v, want [ur0 a-snap]", got)
	}
}

// BenchmarkThreadList lists the threads of a principal that has 1,000 long ones (three turns
// of 20 KB questions and replies each, 120 KB a thread) and reports the bytes a list reads
// and its time: heads' headers only.
//
//	go test -run '^$' -bench ThreadList -benchtime 5x ./jetstream/
func BenchmarkThreadList(b *testing.B) {
	s := openStore(b, testConfig(b))
	ctx := context.Background()
	const threads = 1000
	longThreads(b, s, threads)
	b.ResetTimer()
	read := 0
	for range b.N {
		list, n, err := s.threadsRead(ctx, "alice")
		if err != nil || len(list) != threads {
			b.Fatalf("list: %d threads, %v", len(list), err)
		}
		read = n
	}
	b.ReportMetric(float64(read), "bytes-read/list")
	b.ReportMetric(float64(read)/threads, "bytes-read/thread")
}
