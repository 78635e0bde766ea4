package jetstream

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestSharedTail: many readers following one log from different offsets, opened while it is
// written, share one consumer; each gets exactly the events after its own offset, in order,
// once; a reader that stops reading does not hold the others back (it is detached and goes
// on with a consumer of its own, missing nothing); the consumer goes with the last reader.
func TestSharedTail(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := s.Create(ctx, "alice", "popular", "t")
	if err != nil {
		t.Fatal(err)
	}
	const total = tailBacklog + 2*tailRing
	var events [][]byte
	for i := range total {
		events = append(events, event("p", i))
	}
	offs := mustAppend(t, w, events[:100])

	type reader struct {
		r     *Reader
		after int // index of the event it reads after (-1: from the start)
	}
	var readers []reader
	open := func(after int) {
		off := FromStart
		if after >= 0 {
			off = offs[after]
		}
		r, err := s.Read(ctx, "alice", "popular", off)
		if err != nil {
			t.Fatal(err)
		}
		readers = append(readers, reader{r, after})
	}
	for i := range 20 {
		open(i*5 - 1)
	}
	if n := consumerCount(t, s); n != 1 {
		t.Fatalf("20 readers of one log hold %d consumers, want 1", n)
	}
	// The slow reader reads one event, then nothing until every other reader is done.
	slow := readers[0]
	if e, err := slow.r.Next(ctx); err != nil || e.Offset != offs[0] {
		t.Fatalf("slow reader's first event: %v %v", e.Offset, err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(readers))
	for _, rd := range readers[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := rd.after + 1; i < total; i++ {
				e, err := rd.r.Next(ctx)
				if err != nil {
					errs <- fmt.Errorf("reader after %d: event %d: %v", rd.after, i, err)
					return
				}
				if string(e.Event) != string(events[i]) {
					errs <- fmt.Errorf("reader after %d: event %d is %s, want %s", rd.after, i, e.Event, events[i])
					return
				}
			}
		}()
	}
	for _, e := range events[100:] { // one message each: the slow reader falls behind
		offs = append(offs, mustAppend(t, w, [][]byte{e})...)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := 1; i < total; i++ {
		e, err := slow.r.Next(ctx)
		if err != nil || e.Offset != offs[i] {
			t.Fatalf("slow reader, event %d: %v %v, want %s", i, e.Offset, err, offs[i])
		}
	}
	for _, rd := range readers {
		rd.r.Close()
	}
	for deadline := time.Now().Add(10 * time.Second); consumerCount(t, s) > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d consumers outlive the readers", consumerCount(t, s))
		}
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
}
