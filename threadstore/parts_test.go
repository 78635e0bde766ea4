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
)

// TestThreadLargerThanAMessage grows one thread, from two stores at once (two gateways),
// far past what one NATS message holds: every message of every turn is in the thread,
// whole; the list still shows it; a delete removes it and its parts.
func TestThreadLargerThanAMessage(t *testing.T) {
	const maxPayload = 64 << 10
	ns := testenv.StartNATS(t, server.Options{StoreDir: t.TempDir(), MaxPayload: maxPayload})
	var stores []*Store
	for range 2 {
		cfg := testConfig(t)
		cfg.URLs = ns.ClientURL()
		stores = append(stores, openStore(t, cfg))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const perStore = 10
	reply := func(si, i int) string { return fmt.Sprintf("%d.%d ", si, i) + strings.Repeat("x", 7000) }
	var wg sync.WaitGroup
	errs := make(chan error, 2*perStore)
	for si, s := range stores {
		wg.Go(func() {
			for i := range perStore {
				runID := fmt.Sprintf("run-%d-%d", si, i)
				input := turnInput("T", runID, "u-"+runID, fmt.Sprintf("hello %d %d", si, i))
				ahead := s.ReadThreadAhead(ctx, "alice", "T")
				if _, err := s.AcceptRun(ctx, "alice", "T", runID, input, ahead, Overlap{}); err != nil {
					errs <- err
					return
				}
				if err := s.FinishRun(ctx, "alice", "T", runID, turnEvents("T", runID, reply(si, i))); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	waitSealed(t, stores[0])
	waitSealed(t, stores[1])
	th, err := stores[0].Thread(ctx, "alice", "T")
	if err != nil {
		t.Fatal(err)
	}
	all, _, err := stores[0].threadPage(ctx, th, th.Transcript.Messages, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(all); len(b) < 2*maxPayload {
		t.Fatalf("the thread's messages are %d bytes, want them past two NATS messages", len(b))
	}
	if th.Sealed == nil {
		t.Fatal("no message of the thread is sealed")
	}
	got := texts(t, stores[0], th)
	runs, err := stores[0].AllRuns(ctx, th)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2*perStore || len(got) != 4*perStore || th.Dropped != 0 {
		t.Fatalf("thread holds %d runs and %d messages (%d dropped), want %d and %d", len(runs), len(got), th.Dropped, 2*perStore, 4*perStore)
	}
	for si := range stores {
		for i := range perStore {
			runID := fmt.Sprintf("run-%d-%d", si, i)
			if got["u-"+runID] != fmt.Sprintf("user:hello %d %d", si, i) || got["a-"+runID] != "assistant:re: "+reply(si, i) {
				t.Errorf("run %s: user %.40q, assistant %.40q", runID, got["u-"+runID], got["a-"+runID])
			}
		}
	}
	list, err := stores[1].Threads(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].ThreadID != "T" || list[0].Title == "" || list[0].ActiveRun != "" {
		t.Fatalf("Threads = %+v, want T, titled, with no active run", list)
	}
	if err := stores[1].DeleteThread(ctx, "alice", "T"); err != nil {
		t.Fatal(err)
	}
	if _, err := stores[0].Thread(ctx, "alice", "T"); !errors.Is(err, ErrUnknownThread) {
		t.Fatalf("Thread after delete: %v, want ErrUnknownThread", err)
	}
	for {
		keys, err := stores[0].threads.ListKeys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var left []string
		for k := range keys.Keys() {
			left = append(left, k)
		}
		if len(left) == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("keys left after the delete: %v", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestThreadValueFormat: a thread that fits in one message is written as before parts
// existed (one JSON value, the Thread itself), so a value written by an older gateway reads
// as it did and an older gateway reads a newer one.
func TestThreadValueFormat(t *testing.T) {
	old := `{"principal":"alice","threadId":"T","title":"hi","created":"2026-12-01T10:00:00Z",` +
		`"updated":"2026-12-01T10:00:01Z","runs":[{"runId":"r1","state":"finished","started":"2026-12-01T10:00:00Z",` +
		`"ended":"2026-12-01T10:00:01Z"}],"transcript":{}}`
	var th Thread
	if err := json.Unmarshal([]byte(old), &th); err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(th)
	b, _ := json.Marshal(threadValue{Thread: th})
	if string(a) != string(b) {
		t.Fatalf("a thread's value is\n%s\nwant\n%s", b, a)
	}
}
