package conversation_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/budget"
	"github.com/wsgateway/wsgateway/conversation"
)

// readBackStore counts the logs read back whole at once (Snapshot); each read takes a
// while, as a long log's does, so that reads of runs ending together overlap unless they
// wait for each other.
type readBackStore struct {
	conversation.Store
	mu            sync.Mutex
	reading, most int
	reads         int
}

func (r *readBackStore) Snapshot(ctx context.Context, principal, runID string) ([]conversation.Entry, bool, error) {
	r.mu.Lock()
	r.reading++
	r.most = max(r.most, r.reading)
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.reading--
		r.reads++
		r.mu.Unlock()
	}()
	time.Sleep(200 * time.Millisecond)
	return r.Store.Snapshot(ctx, principal, runID)
}

func (r *readBackStore) counts() (reads, most int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reads, r.most
}

// TestLongRunsEndingTogetherReadBackInTurn: runs too long to keep their events for their
// thread's update read their logs back at their end. When many end together (a burst of long
// turns, or every turn held through a NATS stall) they read them one after another as the
// memory budget makes room, not all at once: here each read is larger than an eighth of the
// budget, so one at a time. Every run's thread still gets its whole reply.
func TestLongRunsEndingTogetherReadBackInTurn(t *testing.T) {
	const runs, tokens = 4, 4000 // about 340 KB of events each, over what a run keeps
	th := &readBackStore{}
	e := newEnv(t, envOptions{budget: budget.New(4 << 20), wrap: func(inner conversation.Store) conversation.Store {
		th.Store = inner
		return th
	}})
	var wg sync.WaitGroup
	for i := range runs {
		cl := dial(t, e.url(), "")
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl.send(threadRunFrame(fmt.Sprintf("T%d", i), fmt.Sprintf("long-%d", i), script{Tokens: tokens}))
			if got := summary(cl.untilTerminal()); got != tokenTurn(tokens) {
				t.Errorf("run %d = %.80s…, want %d deltas and RUN_FINISHED", i, got, tokens)
			}
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for reads, _ := th.counts(); reads < runs; reads, _ = th.counts() {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d logs read back after 30s", reads, runs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, most := th.counts(); most != 1 {
		t.Errorf("logs read back at once: %d, want 1 (each is over an eighth of the budget)", most)
	}
	for i := range runs {
		h := e.hydrate(t, "/api/chat", "", "threadId", fmt.Sprintf("T%d", i))
		var reply string
		for _, m := range h.Messages {
			if m.Role == "assistant" {
				for _, p := range m.Parts {
					reply += p.Content
				}
			}
		}
		if n := strings.Count(reply, " "); h.ActiveRun != nil || n != tokens {
			t.Errorf("thread T%d: active run %v, reply of %d deltas; want finished with %d", i, h.ActiveRun, n, tokens)
		}
	}
}
