package jetstream

import (
	"context"
	"fmt"
	"testing"
)

// TestStreamsChangeLosesNoRun: runs created with one stream stay readable, resumable and
// resubmittable after a restart with three (new runs then spread over all three), and the
// runs of the three streams after a restart back to one.
func TestStreamsChangeLosesNoRun(t *testing.T) {
	cfg := testConfig(t)
	host := openStore(t, cfg) // holds the server
	cfg.URLs = host.ClientURL()
	ctx := context.Background()

	write := func(s *Store, runID string) []string {
		w, err := s.Create(ctx, "alice", runID, "t")
		if err != nil {
			t.Fatalf("Create %s: %v", runID, err)
		}
		offs := mustAppend(t, w, [][]byte{event(runID, 0), event(runID, 1)})
		if err := w.Close(ctx); err != nil {
			t.Fatal(err)
		}
		return offs
	}
	check := func(s *Store, runID string, offs []string) {
		t.Helper()
		entries, closed, err := s.Snapshot(ctx, "alice", runID)
		if err != nil || !closed {
			t.Fatalf("Snapshot %s = closed %v, %v", runID, closed, err)
		}
		checkEntries(t, runID, entries, [][]byte{event(runID, 0), event(runID, 1)}, offs)
		r, err := s.Read(ctx, "alice", runID, offs[0])
		if err != nil {
			t.Fatalf("resume %s after its first offset: %v", runID, err)
		}
		checkEntries(t, runID+" resumed", readAll(t, r), [][]byte{event(runID, 1)}, offs[1:])
	}

	one := openStore(t, cfg)
	old := write(one, "before")
	one.Close()

	cfg.Streams = 3
	three := openStore(t, cfg)
	check(three, "before", old)
	if info, _ := three.Run(ctx, "alice", "before"); info.Stream != 0 {
		t.Fatalf("run created with one stream is on stream %d", info.Stream)
	}
	offs := map[string][]string{}
	used := map[int]int{}
	for i := range 30 {
		id := fmt.Sprintf("spread-%d", i)
		offs[id] = write(three, id)
		info, err := three.Run(ctx, "alice", id)
		if err != nil {
			t.Fatal(err)
		}
		used[info.Stream]++
	}
	t.Logf("30 runs over 3 streams: %v", used)
	if len(used) != 3 {
		t.Fatalf("30 new runs went to streams %v, want all three", used)
	}
	// A resubmit keeps the run's stream.
	w, err := three.Create(ctx, "alice", "before", "t")
	if err != nil {
		t.Fatal(err)
	}
	if w.Info().Stream != 0 || w.Info().Generation != 2 {
		t.Fatalf("resubmit of a run of stream 0: stream %d generation %d", w.Info().Stream, w.Info().Generation)
	}
	old = mustAppend(t, w, [][]byte{event("before", 0), event("before", 1)})
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	three.Close()

	cfg.Streams = 1
	back := openStore(t, cfg)
	check(back, "before", old)
	for id, o := range offs {
		check(back, id, o)
	}
}
