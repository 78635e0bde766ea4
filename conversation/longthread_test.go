package conversation_test

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	nats "github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// longThreadTurns is the length of BenchmarkThreadLog's thread.
var longThreadTurns = flag.Int("longthread-turns", 10000, "turns of BenchmarkThreadLog's thread")

// Each reply of a long thread is about 7 KB: 100 deltas of 70 bytes.
const longDeltas, longDeltaBytes = 100, 70

// longThread runs turns on one thread of e, one after the other on one socket, each run
// frame carrying only its own user message ("u<k>", "question <k>"), each reply about 7 KB;
// it returns each turn's first event's time (run frame to run.accepted).
func longThread(tb testing.TB, e *env, threadID string, turns int) []time.Duration {
	tb.Helper()
	cl := dial(tb, e.url(), "")
	lat := make([]time.Duration, 0, turns)
	start := time.Now()
	k := 0
	defer func() {
		if tb.Failed() {
			tb.Logf("failed at turn %d of %d, %s in", k, turns, time.Since(start).Round(time.Millisecond))
		}
	}()
	for ; k < turns; k++ {
		if k > 0 && k%2000 == 0 {
			th, err := e.threads.Thread(context.Background(), "p1", threadID)
			if err != nil {
				tb.Fatal(err)
			}
			tb.Logf("turn %d: %s in, %d messages in the head", k, time.Since(start).Round(time.Millisecond), len(th.Transcript.Messages))
		}
		sent := time.Now()
		cl.send(threadFrame(threadID, fmt.Sprintf("r%d", k), script{Tokens: longDeltas, DeltaBytes: longDeltaBytes}, fmt.Sprintf("u%d", k), fmt.Sprintf("question %d", k)))
		f := cl.next(20 * time.Second)
		lat = append(lat, time.Since(sent))
		if f.err != nil || f.Type != "CUSTOM" {
			tb.Fatalf("turn %d: first frame %s (%v), want run.accepted", k, f.raw, f.err)
		}
		cl.untilTerminal()
	}
	return lat
}

// pageBack hydrates the thread page by page (limit, before=cursor), newest first, as the
// client pages back, and returns its messages as "<id> <role>: <text>", oldest first, and
// the pages it took.
func pageBack(tb testing.TB, e *env, threadID string, limit int) (msgs []string, pages int) {
	tb.Helper()
	var all [][]string
	for before := ""; ; {
		kv := []string{"threadId", threadID, "limit", fmt.Sprint(limit)}
		if before != "" {
			kv = append(kv, "before", before)
		}
		h := e.hydrate(tb, "/api/chat", "", kv...)
		var page []string
		for _, m := range h.Messages {
			var text strings.Builder
			for _, p := range m.Parts {
				text.WriteString(p.Content)
			}
			page = append(page, m.ID+" "+m.Role+": "+text.String())
		}
		if len(page) == 0 {
			tb.Fatalf("page %d before %q is empty", len(all), before)
		}
		all = append(all, page)
		if h.Page == nil || !h.Page.Truncated {
			break
		}
		before = h.Page.Cursor
	}
	for _, p := range slices.Backward(all) {
		msgs = append(msgs, p...)
	}
	return msgs, len(all)
}

// checkWhole fails unless msgs are the turns' messages, in order, once each: each user
// message with its id and text, each reply whole.
func checkWhole(tb testing.TB, msgs []string, turns int) {
	tb.Helper()
	if len(msgs) != 2*turns {
		tb.Fatalf("paged hydrate returned %d messages, want %d", len(msgs), 2*turns)
	}
	var reply strings.Builder
	for d := 1; d <= longDeltas; d++ {
		s := fmt.Sprintf("t%d ", d)
		reply.WriteString(s + strings.Repeat("x", longDeltaBytes-len(s)))
	}
	for k := range turns {
		wantUser := fmt.Sprintf("u%d user: question %d", k, k)
		wantReply := fmt.Sprintf("m-r%d-1 assistant: %s", k, reply.String())
		if u, r := msgs[2*k], msgs[2*k+1]; u != wantUser || r != wantReply {
			tb.Fatalf("turn %d: messages %.60q, %.60q, want %.60q, %.60q", k, u, r, wantUser, wantReply)
		}
	}
}

// longEnv is the gateway of these long threads: the agent is given what the default
// --agent-history-bytes (512 KiB) takes of the thread, as a deployment gives it.
var longEnv = envOptions{runFrameRate: 1e6, runFrameBurst: 1e6, historyBytes: 512 << 10}

func median(l []time.Duration) time.Duration {
	l = slices.Clone(l)
	slices.Sort(l)
	return l[len(l)/2]
}

// TestLongThreadWhole: 300 turns on one thread, each reply about 7 KB (2 MB in all, twice
// what one NATS message holds): a paged hydrate returns all 600 messages, in order, each
// user message with its id and text, each reply whole; so does a hydrate of the whole
// transcript, on the gateway and on a second one.
func TestLongThreadWhole(t *testing.T) {
	const turns = 300
	e := newEnv(t, longEnv)
	longThread(t, e, "whole", turns)
	msgs, pages := pageBack(t, e, "whole", 100)
	checkWhole(t, msgs, turns)
	if pages != 6 {
		t.Errorf("%d pages of 100, want 6", pages)
	}
	other := newEnv(t, envOptions{natsURL: e.store.ClientURL()})
	h := other.hydrate(t, "/api/chat", "", "threadId", "whole")
	if len(h.Messages) != 2*turns || h.Messages[0].ID != "u0" || h.Messages[2*turns-1].ID != fmt.Sprintf("m-r%d-1", turns-1) || h.Page != nil {
		t.Fatalf("whole hydrate on another gateway: %d messages, page %+v", len(h.Messages), h.Page)
	}
}

// BenchmarkLongThreadWhole runs TestLongThreadWhole's 300 turns and reports the first
// event's median over turns 1 to 30 and 271 to 300, and their ratio.
//
//	go test -run '^$' -bench LongThreadWhole -benchtime 1x ./conversation/
func BenchmarkLongThreadWhole(b *testing.B) {
	const turns = 300
	for i := range b.N {
		e := newEnv(b, longEnv)
		lat := longThread(b, e, fmt.Sprintf("whole-%d", i), turns)
		msgs, _ := pageBack(b, e, fmt.Sprintf("whole-%d", i), 100)
		checkWhole(b, msgs, turns)
		first, last := median(lat[:turns/10]), median(lat[turns-turns/10:])
		b.ReportMetric(float64(first.Microseconds()), "first-tenth-p50-µs")
		b.ReportMetric(float64(last.Microseconds()), "last-tenth-p50-µs")
		b.ReportMetric(float64(last)/float64(first), "last/first")
	}
}

// BenchmarkThreadLog runs -longthread-turns turns (default 10,000) on one thread, each reply
// about 7 KB, and reports: the first event at turns 1, 100, 1,000 and 10,000 (the median of
// the ten turns ending there, µs); the thread store's bytes written per turn against the
// reply's own size; the thread bucket's storage per message; from a second gateway (nothing
// of the thread in its memory), the newest page of 100 (the first hydrate, and the median of
// ten), and paging back to the first message (every page checked whole).
//
//	go test -run '^$' -bench ThreadLog -benchtime 1x -timeout 60m ./conversation/ -args -longthread-turns=10000
func BenchmarkThreadLog(b *testing.B) {
	turns := *longThreadTurns
	for i := range b.N {
		e := newEnv(b, longEnv)
		threadID := fmt.Sprintf("log-%d", i)
		start := time.Now()
		lat := longThread(b, e, threadID, turns)
		b.Logf("%d turns in %s", turns, time.Since(start).Round(time.Second))
		for _, at := range []int{1, 100, 1000, 10000} {
			if at <= turns {
				b.ReportMetric(float64(median(lat[max(at-10, 0):at]).Microseconds()), fmt.Sprintf("turn%d-first-event-µs", at))
			}
		}
		replyBytes := longDeltas * longDeltaBytes
		written := e.threads.ThreadBytesWritten()
		b.ReportMetric(float64(written)/float64(turns), "thread-bytes/turn")
		b.ReportMetric(float64(written)/float64(turns)/float64(replyBytes), "thread-bytes/reply-bytes")
		nc, err := nats.Connect(e.store.ClientURL())
		if err != nil {
			b.Fatal(err)
		}
		js, _ := natsjs.New(nc)
		st, err := js.Stream(context.Background(), "KV_wsgateway_threads")
		if err != nil {
			b.Fatal(err)
		}
		info, err := st.Info(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		nc.Close()
		b.ReportMetric(float64(info.State.Bytes)/float64(2*turns), "stored-bytes/message")

		other := newEnv(b, envOptions{natsURL: e.store.ClientURL()})
		var newest []time.Duration
		for range 11 {
			t0 := time.Now()
			h := other.hydrate(b, "/api/chat", "", "threadId", threadID, "limit", "100")
			newest = append(newest, time.Since(t0))
			if len(h.Messages) != 100 || h.Page == nil || !h.Page.Truncated {
				b.Fatalf("newest page: %d messages, page %+v", len(h.Messages), h.Page)
			}
		}
		b.ReportMetric(float64(newest[0].Microseconds()), "newest-page-cold-µs")
		b.ReportMetric(float64(median(newest[1:]).Microseconds()), "newest-page-p50-µs")
		t0 := time.Now()
		msgs, pages := pageBack(b, other, threadID, 100)
		b.ReportMetric(float64(time.Since(t0).Milliseconds()), "page-back-to-first-ms")
		b.ReportMetric(float64(pages), "pages")
		checkWhole(b, msgs, turns)
	}
}
