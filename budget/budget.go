// Package budget is the gateway's one account of the memory that clients and agents make it
// hold: events waiting to be stored (the append backlog), frames queued to sockets and HTTP
// streams, and logs read whole (hydrates, a thread's update at a run's end). Every place that
// holds such bytes charges them here while it holds them (Take, Release), so that one bound
// covers all of them together, however the load is spread.
//
// A Budget answers three questions at three levels of use:
//
//   - Room: below half its limit, producers that can wait (an agent's next event, a
//     replay's next frame) go on; at half they wait, so what is stored and what is running
//     goes on, only slower, and nothing is dropped. An agent faster than JetStream, or one
//     whose events wait through a NATS stall, stops here.
//   - Admit: below three quarters of its limit, new work may start (a turn, a hydrate);
//     beyond, the gateway refuses new work before anything running has to give way. Since
//     waiting producers stop at half, only what cannot wait takes the budget this far:
//     frames queued to clients, logs read whole.
//   - Full: at its limit, a frame for a socket that is already behind does not fit: the
//     socket is closed as a slow consumer and resumes from the log.
//
// What can wait and knows its size before it holds it (a log read back whole for a thread)
// reserves it instead (Reserve): it waits while the budget is over a quarter, so that
// reservations never take the room producers and replays need to go on.
//
// A share (Share) is a budget of its own that also charges its parent: the append backlog's
// bound (--max-backlog) is a share of the gateway's. A nil *Budget is unlimited: it admits
// everything and charges nothing.
package budget

import (
	"context"
	"sync"
	"sync/atomic"
)

// Budget counts bytes held against a limit. Its methods are safe for concurrent use.
type Budget struct {
	limit  int64
	parent *Budget
	used   atomic.Int64

	// waiting counts the Wait calls of this budget's tree (kept at its root), woken by
	// closing room (under mu) when bytes are released anywhere in the tree.
	waiting atomic.Int64
	mu      sync.Mutex
	room    chan struct{}
	// reserving makes each Reserve's check and charge one step (kept at the root).
	reserving sync.Mutex
}

// New returns a budget of limit bytes; limit <= 0 returns nil, an unlimited budget.
func New(limit int64) *Budget {
	if limit <= 0 {
		return nil
	}
	return &Budget{limit: limit, room: make(chan struct{})}
}

// Share returns a budget of limit bytes whose charges are also b's. On a nil b it is a
// budget of its own.
func (b *Budget) Share(limit int64) *Budget {
	s := New(limit)
	if s != nil {
		s.parent = b
	}
	return s
}

// Limit returns the budget's limit, 0 for an unlimited one.
func (b *Budget) Limit() int64 {
	if b == nil {
		return 0
	}
	return b.limit
}

// Used returns the bytes charged to the budget now.
func (b *Budget) Used() int64 {
	if b == nil {
		return 0
	}
	return b.used.Load()
}

// Take charges n bytes to the budget and its parents, whatever they hold: the bytes are
// held already, or must be (a frame for a socket whose queue is empty).
func (b *Budget) Take(n int64) {
	for ; b != nil; b = b.parent {
		b.used.Add(n)
	}
}

// Release gives back n bytes Take charged, and wakes the Wait calls of the tree.
func (b *Budget) Release(n int64) {
	if b == nil {
		return
	}
	root := b
	for ; b != nil; b = b.parent {
		b.used.Add(-n)
		root = b
	}
	root.wake()
}

// Room reports whether producers that can wait may go on: the budget and each parent are
// under half their limit.
func (b *Budget) Room() bool { return b.under(1, 2) }

// Admit reports whether new work may start: the budget and each parent are under three
// quarters of their limit.
func (b *Budget) Admit() bool { return b.under(3, 4) }

// under reports whether the budget and each parent are under num/den of their limit.
func (b *Budget) under(num, den int64) bool {
	for ; b != nil; b = b.parent {
		if b.used.Load() >= b.limit/den*num {
			return false
		}
	}
	return true
}

// Full reports whether the budget or a parent is at its limit.
func (b *Budget) Full() bool {
	for ; b != nil; b = b.parent {
		if b.used.Load() >= b.limit {
			return true
		}
	}
	return false
}

// Reserve waits until n more bytes fit under a quarter of the limit of the budget and of
// each parent, then charges them (Take); a reservation larger than an eighth of a limit
// waits until that budget is under an eighth. Reservations are checked and charged one at a
// time, so that many waiting together do not all take the same room. It returns ctx's
// error, charging nothing, if ctx ends first. For what can wait and knows its size before
// it holds it: a log about to be read whole in the background. Reservations stop at a
// quarter so that, however many wait, producers and replays keep room to go on (Room).
func (b *Budget) Reserve(ctx context.Context, n int64) error {
	if b == nil {
		return nil
	}
	root := b.root()
	return b.Wait(ctx, nil, func() bool {
		root.reserving.Lock()
		defer root.reserving.Unlock()
		for p := b; p != nil; p = p.parent {
			if p.used.Load()+min(n, p.limit/8) > p.limit/4 {
				return false
			}
		}
		b.Take(n)
		return true
	})
}

// root returns the budget at the root of b's tree.
func (b *Budget) root() *Budget {
	for b != nil && b.parent != nil {
		b = b.parent
	}
	return b
}

// Wait returns nil once ready reports true, checking it now and after each release in the
// budget's tree; it returns ctx's error if ctx ends first, and nil if stop is closed. ready
// is how the caller combines its own bounds with Room.
func (b *Budget) Wait(ctx context.Context, stop <-chan struct{}, ready func() bool) error {
	if ready() {
		return nil
	}
	root := b.root()
	if root == nil {
		return nil // unlimited: nothing to wait for that a release would change
	}
	root.waiting.Add(1)
	defer root.waiting.Add(-1)
	for {
		// Taken before ready is asked again, so that a release in between closes it.
		room := root.roomChan()
		if ready() {
			return nil
		}
		select {
		case <-room:
		case <-stop:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// roomChan returns the channel closed at the next release.
func (b *Budget) roomChan() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.room
}

// wake wakes the Wait calls waiting, if any.
func (b *Budget) wake() {
	if b.waiting.Load() == 0 {
		return
	}
	b.mu.Lock()
	close(b.room)
	b.room = make(chan struct{})
	b.mu.Unlock()
}
