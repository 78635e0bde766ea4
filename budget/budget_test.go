package budget

import (
	"context"
	"testing"
	"time"
)

// TestLevels: a budget has room below half its limit, admits new work below three quarters,
// is full at its limit, and a share's charges are its parent's too.
func TestLevels(t *testing.T) {
	b := New(100)
	s := b.Share(1000)
	s.Take(50)
	if b.Room() || !b.Admit() || b.Full() || s.Room() {
		t.Errorf("at 50 of 100: room %v admit %v full %v, share room %v; want no room, admitted, not full", b.Room(), b.Admit(), b.Full(), s.Room())
	}
	b.Take(50)
	if b.Admit() || !b.Full() || !s.Full() {
		t.Errorf("at 100 of 100: admit %v full %v, share full %v; want refused and full", b.Admit(), b.Full(), s.Full())
	}
	s.Release(50)
	b.Release(50)
	if b.Used() != 0 || s.Used() != 0 || !b.Room() {
		t.Errorf("released: used %d and %d, room %v; want 0, 0, room", b.Used(), s.Used(), b.Room())
	}
	var unlimited *Budget
	unlimited.Take(1 << 40)
	if !unlimited.Room() || !unlimited.Admit() || unlimited.Full() || unlimited.Used() != 0 {
		t.Error("a nil budget must be unlimited")
	}
}

// TestWaitWakes: a Wait for room returns once a release anywhere in the tree makes room,
// and with ctx's error when ctx ends first.
func TestWaitWakes(t *testing.T) {
	b := New(100)
	s := b.Share(1000)
	b.Take(80)
	done := make(chan error, 1)
	go func() { done <- s.Wait(context.Background(), nil, b.Room) }()
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v with no room", err)
	case <-time.After(50 * time.Millisecond):
	}
	b.Release(80)
	if err := <-done; err != nil {
		t.Errorf("Wait after the release = %v, want nil", err)
	}
	b.Take(80)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Wait(ctx, nil, b.Room); err != context.Canceled {
		t.Errorf("Wait with an ended context = %v, want context.Canceled", err)
	}
}

// TestReserveInTurn: reservations go while they fit under a quarter of the budget (one larger
// than an eighth while it is under an eighth), wait otherwise until a release makes room,
// charge what they reserve, and charge nothing when their context ends first.
func TestReserveInTurn(t *testing.T) {
	b := New(800) // a quarter: 200; an eighth: 100
	s := b.Share(10000)
	ctx := context.Background()
	if err := s.Reserve(ctx, 150); err != nil || b.Used() != 150 || s.Used() != 150 {
		t.Fatalf("first Reserve = %v, used %d and %d; want nil, 150 and 150", err, b.Used(), s.Used())
	}
	done := make(chan error, 1)
	go func() { done <- s.Reserve(ctx, 150) }()
	select {
	case err := <-done:
		t.Fatalf("second Reserve returned %v over a quarter of the parent", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := b.Reserve(ctx, 40); err != nil { // fits beside the first: 190 of 200
		t.Fatalf("a small Reserve = %v", err)
	}
	b.Release(40)
	s.Release(150)
	if err := <-done; err != nil || b.Used() != 150 {
		t.Errorf("second Reserve after the release = %v, used %d; want nil, 150", err, b.Used())
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := b.Reserve(cctx, 150); err != context.Canceled || b.Used() != 150 {
		t.Errorf("Reserve with an ended context = %v, used %d; want context.Canceled, 150", err, b.Used())
	}
	var unlimited *Budget
	if err := unlimited.Reserve(cctx, 1<<40); err != nil {
		t.Errorf("Reserve on an unlimited budget = %v, want nil", err)
	}
}
