package jetstream

import (
	"context"
	"testing"
	"time"
)

// TestReaderReplacesStuckConsumer: a reader's consumer stays alive, answers its pull requests
// with heartbeats, and delivers nothing while the log grows (what consumers created on a
// replica while the stream had no leader did in a 3-node cluster; here the consumer is
// paused). The reader notices within its idle bound and returns every event, once, in order.
func TestReaderReplacesStuckConsumer(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx := context.Background()
	w, err := s.Create(ctx, "alice", "stuck", "t")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	var events [][]byte
	for i := range 5 {
		events = append(events, event("stuck", i))
	}
	offs := mustAppend(t, w, events[:2])
	r, err := s.Read(ctx, "alice", "stuck", FromStart)
	if err != nil {
		t.Fatal(err)
	}
	f := startFollower(r)
	defer f.stop()
	if !f.waitFor(2, time.Now().Add(30*time.Second)) {
		t.Fatalf("the reader got %d of 2 events in 30s", len(f.got()))
	}
	var names []string
	consumers := s.firstStream().ListConsumers(ctx)
	for c := range consumers.Info() {
		names = append(names, c.Name)
	}
	if err := consumers.Err(); err != nil || len(names) != 1 {
		t.Fatalf("the stream's consumers: %v, %v; want the reader's", names, err)
	}
	if _, err := s.firstStream().PauseConsumer(ctx, names[0], time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	offs = append(offs, mustAppend(t, w, events[2:])...)
	for deadline := time.Now().Add(30 * time.Second); len(f.got()) < len(events); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the reader returned %d of %d events, its consumer stuck for 30s", len(f.got()), len(events))
		}
	}
	checkEntries(t, "reader of a stuck consumer", f.got(), events, offs)
}
