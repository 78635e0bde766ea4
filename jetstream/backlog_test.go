package jetstream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/wsgateway/wsgateway/internal/testenv"
)

// restartableServer starts a NATS server a test can shut down and start again on the same
// port and store (testenv.StartNATS(t, opts)), and returns a store's config for it.
func restartableServer(t *testing.T) (server.Options, *server.Server, Config) {
	opts := server.Options{Port: testenv.FreePort(t), StoreDir: t.TempDir()}
	ns := testenv.StartNATS(t, opts)
	cfg := testConfig(t)
	cfg.URLs = ns.ClientURL()
	return opts, ns, cfg
}

// TestBacklogBound: while NATS is away, a writer's WaitRoom blocks once its backlog reaches
// MaxRunBacklog (its context still ends the wait), another writer of the store is not held
// by it, and the store's backlog stays bounded; when NATS is back every event is stored once
// and in order and the backlogs drain to zero.
func TestBacklogBound(t *testing.T) {
	opts, ns, cfg := restartableServer(t)
	cfg.MaxRunBacklog = 64 << 10
	cfg.MaxBacklog = 96 << 10
	cfg.PublishTimeout = 500 * time.Millisecond
	s := openStore(t, cfg)
	ctx := context.Background()
	w1, err := s.Create(ctx, "alice", "backlog-1", "t")
	if err != nil {
		t.Fatal(err)
	}
	w2, err := s.Create(ctx, "alice", "backlog-2", "t")
	if err != nil {
		t.Fatal(err)
	}
	ns.Shutdown()
	ns.WaitForShutdown()

	// The first writer appends while it has room: the bound stops it.
	var events [][]byte
	results := make(chan result, 10000)
	appendOne := func(w *Writer, e []byte) {
		w.Append(e, func(off string, err error) { results <- result{off, err} })
	}
	for i := 0; ; i++ {
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err := w1.WaitRoom(wctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatalf("WaitRoom = %v", err)
		}
		if i == 5000 {
			t.Fatalf("WaitRoom never waited: backlog %d bytes", s.Backlog())
		}
		e := event("b", i)
		events = append(events, e)
		appendOne(w1, e)
	}
	// The events, and the body of the batch in flight: a copy of some of them
	// (TestBacklogChargesBatchInFlight).
	if b := s.Backlog(); b < cfg.MaxRunBacklog || b > 2*cfg.MaxRunBacklog+1024 {
		t.Fatalf("backlog when WaitRoom waits = %d, want MaxRunBacklog %d, and at most as much again in flight", b, cfg.MaxRunBacklog)
	}
	// Another run is not held by the first one's backlog.
	if err := w2.WaitRoom(ctx); err != nil {
		t.Fatalf("WaitRoom of another writer = %v", err)
	}
	var second int64 // the second writer's events' bytes
	for i := range 100 {
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err := w2.WaitRoom(wctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			break // the store's bound
		}
		e := event("o", i)
		second += int64(len(e))
		appendOne(w2, e)
	}
	// With, in flight, at most a copy of the second writer's events.
	if b := s.Backlog(); b > cfg.MaxBacklog+1024+second {
		t.Fatalf("store backlog = %d, want at most about MaxBacklog %d and %d in flight", b, cfg.MaxBacklog, second)
	}

	// A waiter is woken when NATS is back and the backlog drains.
	waited := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		waited <- w1.WaitRoom(wctx)
	}()
	testenv.StartNATS(t, opts)
	if err := <-waited; err != nil {
		t.Fatalf("WaitRoom after the outage = %v", err)
	}
	if err := w1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	close(results)
	for r := range results {
		if r.err != nil {
			t.Fatalf("append across the outage: %v", r.err)
		}
	}
	if b := s.Backlog(); b != 0 {
		t.Fatalf("backlog after every event was stored = %d, want 0", b)
	}
	entries, closed, err := s.Snapshot(ctx, "alice", "backlog-1")
	if err != nil || !closed {
		t.Fatalf("Snapshot = closed %v, %v", closed, err)
	}
	if len(entries) != len(events) {
		t.Fatalf("stored %d events, want %d", len(entries), len(events))
	}
	for i := range entries {
		if string(entries[i].Event) != string(events[i]) {
			t.Fatalf("entry %d = %s, want %s", i, entries[i].Event, events[i])
		}
	}
}

// TestBacklogChargesBatchInFlight: while a batch's publish waits for NATS, its encoded body
// (a second copy of its events) is charged to the backlog beside the events, so that the
// bounds and the memory budget see what the writer holds; once stored, both are given back.
func TestBacklogChargesBatchInFlight(t *testing.T) {
	opts, ns, cfg := restartableServer(t)
	cfg.PublishTimeout = 500 * time.Millisecond
	s := openStore(t, cfg)
	ctx := context.Background()
	w, err := s.Create(ctx, "alice", "in-flight", "t")
	if err != nil {
		t.Fatal(err)
	}
	ns.Shutdown()
	ns.WaitForShutdown()

	const n = 8
	results := make(chan result, n)
	var events int64
	for i := range n {
		e := []byte(fmt.Sprintf(`{"type":"CUSTOM","name":"big","value":"%d %s"}`, i, strings.Repeat("v", 10000)))
		events += int64(len(e) + backlogOverhead)
		w.Append(e, func(off string, err error) { results <- result{off, err} })
	}
	// The writer takes what is queued into one batch and publishes it, retrying while NATS
	// is away: its body, over 10 KB, is charged too.
	deadline := time.Now().Add(10 * time.Second)
	for s.Backlog() < events+10000 {
		if time.Now().After(deadline) {
			t.Fatalf("backlog with a batch in flight = %d, want the events' %d and the batch's body besides", s.Backlog(), events)
		}
		time.Sleep(5 * time.Millisecond)
	}
	testenv.StartNATS(t, opts)
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for range n {
		if r := <-results; r.err != nil {
			t.Fatalf("append across the outage: %v", r.err)
		}
	}
	if b := s.Backlog(); b != 0 {
		t.Fatalf("backlog after every event was stored = %d, want 0", b)
	}
}
