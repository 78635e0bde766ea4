package jetstream

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

var seedFlag = flag.Uint64("jetstream.seed", 0, "seed of TestProperty (0: from the clock)")

// model is what a run's writer was told was stored, in order.
type model struct {
	mu      sync.Mutex
	offsets []string
	events  [][]byte
	errs    []error
}

func (m *model) stored(event []byte) func(string, error) {
	return func(off string, err error) {
		m.mu.Lock()
		defer m.mu.Unlock()
		if err != nil {
			m.errs = append(m.errs, fmt.Errorf("append %.60s: %w", event, err))
			return
		}
		m.offsets = append(m.offsets, off)
		m.events = append(m.events, event)
	}
}

func (m *model) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.offsets)
}

func (m *model) offset(i int) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.offsets[i]
}

// tailCheck is one reader started during the run and what it must return at the end:
// the events after index from-1, where from lies in [lo, hi] (a "now" read races with the
// writer, any other read has lo == hi).
type tailCheck struct {
	name   string
	lo, hi int
	done   chan tailResult
}

type tailResult struct {
	entries []Entry
	err     error
}

// TestProperty drives random appends (bursts, large events, pauses), reads from random
// offsets (-1, now, the last, a random one, past the end, malformed, foreign), snapshots and
// closes on several runs at once: every read returns exactly the events after its offset, in
// order, with no gap and no duplicate, and ends at the close.
func TestProperty(t *testing.T) {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -jetstream.seed=%d)", seed, seed)
	cfg := testConfig(t)
	cfg.MaxBatchBytes = 256 << 10
	s := openStore(t, cfg)
	ctx := context.Background()

	other, err := s.Create(ctx, "alice", "other", "t")
	if err != nil {
		t.Fatal(err)
	}
	foreign := mustAppend(t, other, [][]byte{event("other", 0), event("other", 1)})
	if err := other.Close(ctx); err != nil {
		t.Fatal(err)
	}

	const runs = 4
	var wg sync.WaitGroup
	for n := range runs {
		wg.Add(1)
		rng := rand.New(rand.NewPCG(seed, uint64(n)))
		go func() {
			defer wg.Done()
			propertyRun(t, s, rng, fmt.Sprintf("run-%d", n), foreign)
		}()
	}
	wg.Wait()
}

func propertyRun(t *testing.T, s *Store, rng *rand.Rand, runID string, foreign []string) {
	ctx := context.Background()
	principal := "p-" + runID
	w, err := s.Create(ctx, principal, runID, "t")
	if err != nil {
		t.Errorf("Create(%s): %v", runID, err)
		return
	}
	m := &model{}
	var checks []*tailCheck
	next := 0 // events appended so far
	startTail := func(name, after string, lo, hi int) {
		c := &tailCheck{name: name, lo: lo, hi: hi, done: make(chan tailResult, 1)}
		r, err := s.Read(ctx, principal, runID, after)
		if err != nil {
			t.Errorf("%s: Read(%s, %q) = %v", runID, name, after, err)
			return
		}
		if name == "now" {
			// The tail is what the server holds: it may include a batch already stored
			// whose acknowledgement is still on its way, up to every event queued.
			c.hi = next
		}
		checks = append(checks, c)
		go func() {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			es, err := drain(ctx, r)
			c.done <- tailResult{es, err}
		}()
	}
	appendBurst := func(k int) {
		for range k {
			pad := 10 + rng.IntN(200)
			switch rng.IntN(40) {
			case 0:
				pad = 100 << 10
			case 1, 2:
				pad = 10 << 10
			}
			e := fmt.Appendf(nil, `{"type":"TEXT_MESSAGE_CONTENT","run":%q,"i":%d,"pad":"%s"}`, runID, next, strings.Repeat("x", pad))
			next++
			w.Append(e, m.stored(e))
		}
	}
	waitStored := func() {
		deadline := time.Now().Add(time.Minute)
		for m.len() < next && time.Now().Before(deadline) {
			m.mu.Lock()
			failed := len(m.errs) > 0
			m.mu.Unlock()
			if failed {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	ops := 40 + rng.IntN(60)
	for range ops {
		switch op := rng.IntN(12); {
		case op < 5:
			appendBurst(1 + rng.IntN(40))
		case op == 5:
			waitStored()
		case op == 6:
			time.Sleep(time.Duration(rng.IntN(5)) * time.Millisecond)
		case op == 7:
			startTail("-1", FromStart, 0, 0)
		case op == 8:
			lo := m.len()
			startTail("now", FromNow, lo, lo)
		case op == 9:
			if n := m.len(); n > 0 {
				k := rng.IntN(n)
				if rng.IntN(3) == 0 {
					k = n - 1
				}
				startTail(fmt.Sprintf("after %d", k), m.offset(k), k+1, k+1)
			}
		case op == 10:
			if n := m.len(); n > 0 {
				bad := invalidOffsets(m.offset(n-1), foreign[0])
				for name, off := range bad {
					if r, err := s.Read(ctx, principal, runID, off); !errors.Is(err, ErrInvalidOffset) {
						if r != nil {
							r.Close()
						}
						t.Errorf("%s: Read(%s %q) = %v, want ErrInvalidOffset", runID, name, off, err)
					}
				}
			}
		case op == 11:
			acked := m.len()
			entries, closed, err := s.Snapshot(ctx, principal, runID)
			if err != nil || closed || len(entries) < acked {
				t.Errorf("%s: Snapshot = %d entries, closed %v, %v; want at least %d, open", runID, len(entries), closed, err, acked)
				continue
			}
			m.mu.Lock()
			n := min(len(entries), len(m.events))
			for i := range n {
				if entries[i].Offset != m.offsets[i] || string(entries[i].Event) != string(m.events[i]) {
					t.Errorf("%s: Snapshot entry %d = %s, want %s", runID, i, entries[i].Offset, m.offsets[i])
					break
				}
			}
			m.mu.Unlock()
		}
	}
	if err := w.Close(ctx); err != nil {
		t.Errorf("%s: Close: %v", runID, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.errs) > 0 || len(m.offsets) != next {
		t.Errorf("%s: %d of %d appends stored, errors %v", runID, len(m.offsets), next, m.errs)
		return
	}
	for i := 1; i < len(m.offsets); i++ {
		if m.offsets[i] <= m.offsets[i-1] {
			t.Errorf("%s: offset %d %s not after %s", runID, i, m.offsets[i], m.offsets[i-1])
		}
	}
	for _, c := range checks {
		res := <-c.done
		if res.err != nil {
			t.Errorf("%s: tail %s: %v", runID, c.name, res.err)
			continue
		}
		from := len(m.events) - len(res.entries)
		if from < c.lo || from > c.hi {
			t.Errorf("%s: tail %s returned the last %d of %d events, want from %d..%d", runID, c.name, len(res.entries), len(m.events), c.lo, c.hi)
			continue
		}
		for i, e := range res.entries {
			if e.Offset != m.offsets[from+i] || string(e.Event) != string(m.events[from+i]) {
				t.Errorf("%s: tail %s entry %d = %s, want %s", runID, c.name, i, e.Offset, m.offsets[from+i])
				break
			}
		}
	}
	t.Logf("%s: %d events, %d tails checked", runID, len(m.events), len(checks))
}

// invalidOffsets derives offsets a reader must refuse from the last stored one.
func invalidOffsets(last, foreign string) map[string]string {
	p, _ := parseOffset(last)
	pastSeq, pastIdx, stale := p, p, p
	pastSeq.seq += 1 << 20
	pastIdx.idx = maxBatchEvents - 1
	stale.gen++
	return map[string]string{
		"malformed": "x" + last[1:],
		"truncated": last[:len(last)-1],
		"spaces":    " " + last[1:],
		"foreign":   foreign,
		"past seq":  pastSeq.String(),
		"past idx":  pastIdx.String(),
		"newer gen": stale.String(),
	}
}
