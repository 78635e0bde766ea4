package jetstream

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/wsgateway/wsgateway/internal/testenv"
)

// TestOutageSparesLiveProducers: NATS is away for several lease TTLs while a run is
// producing, so nobody can renew or reap. When it is back, the producer renews its lease and
// goes on: no reaper (of its own store or another's) ends the run with producer_lost, and
// every event, those appended during the outage included, is stored once and in order.
func TestOutageSparesLiveProducers(t *testing.T) {
	opts, ns, cfg := restartableServer(t)
	cfg.LeaseTTL = 1500 * time.Millisecond
	cfg.ReapInterval = 250 * time.Millisecond
	cfg.PublishTimeout = time.Second
	reaped := make(chan struct{}, 4)
	cfg.Metrics = &Metrics{RunReaped: func() { reaped <- struct{}{} }}
	a := openStore(t, cfg) // the producer's store
	b := openStore(t, cfg) // another process's store, whose reaper competes
	ctx := context.Background()
	w, err := a.Create(ctx, "alice", "outage", "t")
	if err != nil {
		t.Fatal(err)
	}
	var events [][]byte
	for i := range 30 {
		events = append(events, event("o", i))
	}
	offs := mustAppend(t, w, events[:10])

	ns.Shutdown()
	ns.WaitForShutdown()
	done := make(chan []result, 1)
	go func() { done <- appendAll(t, w, events[10:20]) }()
	time.Sleep(3 * cfg.LeaseTTL)
	testenv.StartNATS(t, opts)
	for i, r := range <-done {
		if r.err != nil {
			t.Fatalf("append %d across the outage: %v", 10+i, r.err)
		}
		offs = append(offs, r.offset)
	}
	time.Sleep(3 * cfg.LeaseTTL) // the reapers had every chance
	select {
	case <-w.Lost():
		t.Fatalf("the live producer lost its run after the outage: %v", w.Err())
	case <-reaped:
		t.Fatal("a reaper ended a live producer's run after the outage")
	default:
	}
	offs = append(offs, mustAppend(t, w, events[20:])...)
	if err := w.Close(ctx); err != nil {
		t.Fatalf("Close after the outage: %v", err)
	}
	entries, closed, err := b.Snapshot(ctx, "alice", "outage")
	if err != nil || !closed {
		t.Fatalf("Snapshot = closed %v, %v; want closed", closed, err)
	}
	checkEntries(t, "log across the outage", entries, events, offs)
}

// TestReadersReleaseConsumers: every Read holds a consumer on the stream, and nats-server caps
// a stream's consumers (1000 by default, kept here). Readers closed, or read to the log's
// end, release theirs at once: many more reads than the cap, one after another, all succeed.
func TestReadersReleaseConsumers(t *testing.T) {
	cfg := testConfig(t)
	cfg.URLs = testenv.StartNATS(t, server.Options{StoreDir: t.TempDir()}).ClientURL()
	s := openStore(t, cfg)
	ctx := context.Background()
	w, err := s.Create(ctx, "alice", "many-readers", "t")
	if err != nil {
		t.Fatal(err)
	}
	offs := mustAppend(t, w, [][]byte{event("m", 0), event("m", 1)})
	for i := range 600 { // readers closed while the log is open
		r, err := s.Read(ctx, "alice", "many-readers", FromStart)
		if err != nil {
			t.Fatalf("Read %d: %v", i, err)
		}
		if _, err := r.Next(ctx); err != nil {
			t.Fatalf("Next %d: %v", i, err)
		}
		r.Close()
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 600 { // readers that reach the close
		r, err := s.Read(ctx, "alice", "many-readers", offs[0])
		if err != nil {
			t.Fatalf("Read %d after the close: %v", i, err)
		}
		readAll(t, r)
	}
	info, err := s.firstStream().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Consumers > 10 {
		t.Errorf("%d consumers left on the stream after every reader ended, want about none", info.State.Consumers)
	}
}

// TestEmbeddedServerConsumers: the embedded server does not cap a stream's consumers, so more
// than nats-server's default of 1000 readers may tail at once.
func TestEmbeddedServerConsumers(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx := context.Background()
	w, err := s.Create(ctx, "alice", "tailed", "t")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	for i := range 1100 {
		r, err := s.Read(ctx, "alice", "tailed", FromStart)
		if err != nil {
			t.Fatalf("Read %d while the others tail: %v", i, err)
		}
		defer r.Close()
	}
}
