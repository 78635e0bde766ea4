package jetstream

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestReadersCatchUpTogether: many readers start at once on logs whose messages interleave on
// the stream (every client of a dead gateway resuming): each gets its own log whole and in
// order, the part stored before it opened and what follows, to the close; snapshots taken
// meanwhile hold what was stored; no consumer is left once they are done.
func TestReadersCatchUpTogether(t *testing.T) {
	s := openStore(t, testConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const runs, before, after = 24, 15, 5
	writers := make([]*Writer, runs)
	events := make([][][]byte, runs)
	offs := make([][]string, runs)
	for i := range writers {
		w, err := s.Create(ctx, "alice", fmt.Sprintf("catch-up-%d", i), "")
		if err != nil {
			t.Fatal(err)
		}
		writers[i] = w
	}
	appendRound := func(j int) {
		for i, w := range writers {
			ev := event(fmt.Sprintf("r%d", i), j)
			events[i] = append(events[i], ev)
			offs[i] = append(offs[i], mustAppend(t, w, [][]byte{ev})...)
		}
	}
	for j := range before {
		appendRound(j)
	}

	readers := make([]*Reader, runs)
	var wg sync.WaitGroup
	for i := range runs {
		wg.Add(2)
		go func() {
			defer wg.Done()
			r, err := s.Read(ctx, "alice", fmt.Sprintf("catch-up-%d", i), FromStart)
			if err != nil {
				t.Errorf("Read %d: %v", i, err)
				return
			}
			readers[i] = r
			var got []Entry
			for range before {
				e, err := r.Next(ctx)
				if err != nil {
					t.Errorf("reader %d: %v after %d entries", i, err, len(got))
					return
				}
				got = append(got, e)
			}
			checkEntries(t, fmt.Sprintf("reader %d, what was stored before it", i), got, events[i][:before], offs[i][:before])
		}()
		go func() {
			defer wg.Done()
			got, closed, err := s.Snapshot(ctx, "alice", fmt.Sprintf("catch-up-%d", i))
			if err != nil || closed {
				t.Errorf("Snapshot %d = closed %v, %v; want open", i, closed, err)
				return
			}
			checkEntries(t, fmt.Sprintf("snapshot %d", i), got, events[i][:before], offs[i][:before])
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	for j := before; j < before+after; j++ {
		appendRound(j)
	}
	for _, w := range writers {
		if err := w.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i, r := range readers {
		checkEntries(t, fmt.Sprintf("reader %d, what came after", i), readAll(t, r), events[i][before:], offs[i][before:])
	}

	info, err := s.firstStream().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Consumers > 2 {
		t.Errorf("%d consumers left on the stream after every reader ended, want about none", info.State.Consumers)
	}
}
