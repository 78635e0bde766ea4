package conversation

import (
	"errors"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/heartbeat"
)

func TestRegistryMaxTurns(t *testing.T) {
	w, err := heartbeat.New(heartbeat.Config{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	c1, c2 := &conn{}, &conn{}
	c1.hb, c2.hb = w.Add(c1), w.Add(c2)
	var r registry
	add := func(c *conn, id string) (*slot, *slot, error) { return r.add(runKey{"p", id}, "", c, 2, time.Second) }

	a, _, errA := add(c1, "a")
	_, _, errB := add(c1, "b")
	if errA != nil || errB != nil {
		t.Fatalf("add under the cap = %v, %v", errA, errB)
	}
	if _, _, err := add(c1, "c"); !errors.Is(err, errTooManyTurns) {
		t.Errorf("a third key of one socket with max 2 = %v, want errTooManyTurns", err)
	}
	a2, prev, err := add(c1, "a")
	if err != nil || prev != a {
		t.Errorf("resubmit of a at the cap = %v, %v; want a new slot replacing a", prev, err)
	}
	r.end(a) // replaced already: the socket still holds a and b
	if _, _, err := add(c1, "c"); err == nil {
		t.Error("c added while a and b still run")
	}
	if _, _, err := add(c2, "c"); err != nil {
		t.Errorf("another socket's first key = %v, want it added", err)
	}
	if _, _, err := r.add(runKey{"p", "h"}, "", nil, 0, 0); err != nil {
		t.Errorf("an HTTP turn (no owner, no cap) = %v", err)
	}
	if _, prev, err := add(c2, "a"); err != nil || prev != a2 {
		t.Errorf("resubmit of a from another socket = %v, %v; want it to replace a", prev, err)
	}
	if _, _, err := add(c1, "d"); err != nil {
		t.Errorf("after its turn a moved to another socket, the first one's new key = %v", err)
	}
	r.close()
	if _, _, err := add(c2, "e"); !errors.Is(err, errClosing) {
		t.Errorf("add after close = %v, want errClosing", err)
	}
}

// TestRegistryPrincipalBounds: the principal's running turns and its start rate, whatever
// door added them (no owner: HTTP), and a principal of its own bounds.
func TestRegistryPrincipalBounds(t *testing.T) {
	r := registry{limits: func(p string) PrincipalLimits {
		if p == "svc" {
			return PrincipalLimits{Turns: 3, TurnRate: 0.001, TurnBurst: 10}
		}
		// A rate this low refills nothing during the test: the burst is all there is.
		return PrincipalLimits{Turns: 2, TurnRate: 0.001, TurnBurst: 4}
	}}
	add := func(p, id string) (*slot, *slot, error) { return r.add(runKey{p, id}, "", nil, 0, 0) }
	a, _, errA := add("p", "a")
	b, _, errB := add("p", "b")
	if errA != nil || errB != nil {
		t.Fatalf("two turns of p under its bound = %v, %v", errA, errB)
	}
	if _, _, err := add("p", "c"); !errors.Is(err, errPrincipalTurns) {
		t.Errorf("a third turn of p with 2 running = %v, want errPrincipalTurns", err)
	}
	a2, prev, err := add("p", "a")
	if err != nil || prev != a {
		t.Errorf("resubmit of a at p's bound = %v, %v; want a new slot replacing a", prev, err)
	}
	for _, id := range []string{"a", "b", "c"} {
		if _, _, err := add("svc", id); err != nil {
			t.Errorf("svc's turn %s while p is at its bound = %v", id, err)
		}
	}
	r.end(a) // replaced: p still runs a2 and b
	if _, _, err := add("p", "c"); !errors.Is(err, errPrincipalTurns) {
		t.Errorf("c while a2 and b run = %v, want errPrincipalTurns", err)
	}
	r.end(a2)
	if _, _, err := add("p", "c"); err != nil { // p's fourth token (a, b, a2, c)
		t.Errorf("c after a ended = %v, want it added", err)
	}
	r.end(b)
	if _, _, err := add("p", "d"); !errors.Is(err, errTurnRate) {
		t.Errorf("a fifth start of p with a burst of 4 = %v, want errTurnRate", err)
	}
	if n := r.running.Held("p"); n != 1 {
		t.Errorf("p counts %d running turns, want 1 (c)", n)
	}
}
