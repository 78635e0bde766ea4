package jetstream

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/jetstream/lease"
)

// TestTakeoverFencesTheOldProducer: a run kept with its input whose lease expired is handed
// to another store's takeover handler with its input and every stored event; from then on a
// write of the old producer (one that did not learn it lost the run, as a partitioned
// gateway) is refused, the new writer goes on after the stored events, a reader from the
// start reads each event once, and a reader from now starts at the stored tail.
func TestTakeoverFencesTheOldProducer(t *testing.T) {
	cfg := testConfig(t)
	cfg.LeaseTTL = time.Second
	a := openStore(t, cfg)
	cfg.URLs = a.ClientURL()
	b := openStore(t, cfg)
	taken := make(chan Takeover, 2)
	for _, s := range []*Store{a, b} { // whichever reaper comes first
		s.OnTakeover(func(tk Takeover) bool {
			taken <- tk
			return true
		})
	}
	ctx := context.Background()
	input := []byte(`{"runId":"fenced","threadId":"t"}`)
	w, err := a.Create(ctx, "alice", "fenced", "t", WithInput(input))
	if err != nil {
		t.Fatal(err)
	}
	events := [][]byte{event("fenced", 1), event("fenced", 2), event("fenced", 3)}
	offsets := mustAppend(t, w, events)
	if info := w.Info(); !info.Replay {
		t.Fatalf("a run created WithInput: metadata %+v, want Replay", info)
	}
	// The producer's lease expires while it lives (its liveness no longer counts).
	if _, err := a.leaseKV.Put(ctx, w.key, lease.Value{Owner: "partitioned", Expires: 1}.Encode()); err != nil {
		t.Fatal(err)
	}
	var tk Takeover
	select {
	case tk = <-taken:
	case <-time.After(20 * time.Second):
		t.Fatal("no takeover 20s after the lease expired")
	}
	if string(tk.Input) != string(input) || len(tk.Stored) != len(events) || tk.Info.Takeovers != 1 {
		t.Fatalf("takeover: input %s, %d stored, %d takeovers; want %s, %d, 1", tk.Input, len(tk.Stored), tk.Info.Takeovers, input, len(events))
	}
	checkEntries(t, "stored at the takeover", tk.Stored, events, offsets)
	if _, err := w.publish(ctx, encodeBatch(nil, [][]byte{event("fenced", 99)}), ""); !errors.Is(err, ErrFenced) {
		t.Errorf("the old producer's write after the takeover = %v, want ErrFenced", err)
	}
	now, err := a.Read(ctx, "alice", "fenced", FromNow)
	if err != nil {
		t.Fatal(err)
	}
	defer now.Close()
	if now.After() != offsets[len(offsets)-1] {
		t.Errorf("a reader from now starts after %s, want the last stored event %s", now.After(), offsets[len(offsets)-1])
	}
	more := [][]byte{event("fenced", 4), event("fenced", 5)}
	moreOffsets := mustAppend(t, tk.Writer, more)
	if err := tk.Writer.Close(ctx); err != nil {
		t.Fatal(err)
	}
	all, closed, err := a.Snapshot(ctx, "alice", "fenced")
	if err != nil || !closed {
		t.Fatalf("Snapshot: closed %v, %v", closed, err)
	}
	checkEntries(t, "the whole log", all, append(events, more...), append(offsets, moreOffsets...))
	if got := readAll(t, now); len(got) != len(more) {
		t.Errorf("the reader from now read %d events, want the %d appended after the takeover", len(got), len(more))
	}
	info, err := a.Run(ctx, "alice", "fenced")
	if err != nil || info.State != RunClosed || info.Reaped || info.Takeovers != 1 {
		t.Errorf("Run = %+v, %v; want closed, taken over once, not reaped", info, err)
	}
}
