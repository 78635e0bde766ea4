package conversation

import (
	"errors"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/heartbeat"
)

func TestTokenBucket(t *testing.T) {
	ms := func(n int) time.Duration { return time.Hour + time.Duration(n)*time.Millisecond }
	tests := []struct {
		name  string
		rate  float64
		burst int
		at    []time.Duration
		want  string // one letter per take: y allowed, n refused
	}{
		{"burst then refused", 10, 3, []time.Duration{ms(0), ms(1), ms(2), ms(3), ms(4)}, "yyynn"},
		{"refills at the rate", 10, 2, []time.Duration{ms(0), ms(0), ms(0), ms(100), ms(100), ms(300), ms(300), ms(300)}, "yynynyyn"},
		{"refill capped at the burst", 10, 2, []time.Duration{ms(0), ms(10000), ms(10000), ms(10000)}, "yyyn"},
		{"refused takes cost nothing", 1, 1, []time.Duration{ms(0), ms(500), ms(999), ms(1000), ms(1001)}, "ynnyn"},
		{"steady rate passes", 10, 1, []time.Duration{ms(0), ms(100), ms(200), ms(300)}, "yyyy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b tokenBucket
			got := ""
			for _, at := range tt.at {
				if b.take(at, tt.rate, tt.burst) {
					got += "y"
				} else {
					got += "n"
				}
			}
			if got != tt.want {
				t.Errorf("takes = %s, want %s", got, tt.want)
			}
		})
	}
}

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
