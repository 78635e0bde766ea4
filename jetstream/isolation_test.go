package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"
)

// TestForeignCreateTouchesNothing has another principal try to create a running run, through
// the owner's store and through another process's store, at generation 1 and 2: each attempt
// is refused, and the owner's writer keeps its lease through several renewals, its metadata is
// not rewritten and its log holds only its own events.
func TestForeignCreateTouchesNothing(t *testing.T) {
	cfg := testConfig(t)
	cfg.LeaseTTL = 900 * time.Millisecond
	cfg.ReapInterval = 150 * time.Millisecond
	a := openStore(t, cfg) // the owner's store, runs the embedded server
	cfg.URLs = a.ClientURL()
	b := openStore(t, cfg) // another gateway's store
	ctx := context.Background()

	for gen := uint64(1); gen <= 2; gen++ {
		w, err := a.Create(ctx, "alice", "r", "t")
		if err != nil {
			t.Fatal(err)
		}
		if w.Info().Generation != gen {
			t.Fatalf("Generation = %d, want %d", w.Info().Generation, gen)
		}
		events := [][]byte{event("own", 0), event("own", 1)}
		offs := mustAppend(t, w, events[:1])
		metaBefore, err := a.meta.Get(ctx, runKey("r"))
		if err != nil {
			t.Fatal(err)
		}
		// Several attempts, spread over more than two renewal periods.
		for i := range 6 {
			for _, s := range []*Store{a, b} {
				if _, err := s.Create(ctx, "mallory", "r", "t"); !errors.Is(err, ErrForbidden) {
					t.Fatalf("gen %d: Create by another principal = %v, want ErrForbidden", gen, err)
				}
			}
			l, err := a.leases.Get(ctx, runKey("r"))
			if err != nil {
				t.Fatalf("gen %d, attempt %d: the owner's lease: %v", gen, i, err)
			}
			var got lease
			if err := json.Unmarshal(l.Value(), &got); err != nil || got.Owner != a.cfg.Owner || got.Gen != gen {
				t.Fatalf("gen %d, attempt %d: lease = %s, want the owner's (%s, gen %d)", gen, i, l.Value(), a.cfg.Owner, gen)
			}
			time.Sleep(cfg.LeaseTTL / 4)
		}
		select {
		case <-w.Lost():
			t.Fatalf("gen %d: the owner's writer lost its lease: %v", gen, w.Err())
		default:
		}
		if m, err := a.meta.Get(ctx, runKey("r")); err != nil || m.Revision() != metaBefore.Revision() {
			t.Fatalf("gen %d: metadata revision %v (%v), want %d unchanged", gen, m, err, metaBefore.Revision())
		}
		offs = append(offs, mustAppend(t, w, events[1:])...)
		if err := w.Close(ctx); err != nil {
			t.Fatalf("gen %d: Close = %v", gen, err)
		}
		r, err := b.Read(ctx, "alice", "r", FromStart)
		if err != nil {
			t.Fatal(err)
		}
		checkEntries(t, "the owner's log", readAll(t, r), events, offs)
		info, err := b.Run(ctx, "alice", "r")
		if err != nil || info.State != RunClosed || info.Reaped || info.Generation != gen {
			t.Fatalf("Run = %+v, %v; want closed by its writer at generation %d", info, err, gen)
		}
	}
	// A closed run is refused too, and keeps no lease of the refused attempt.
	if _, err := b.Create(ctx, "mallory", "r", "t"); !errors.Is(err, ErrForbidden) {
		t.Fatalf("Create of a closed run by another principal = %v, want ErrForbidden", err)
	}
	if l, err := a.leases.Get(ctx, runKey("r")); err == nil {
		t.Fatalf("a refused Create left a lease: %s", l.Value())
	}
}
