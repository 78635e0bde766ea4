package conversation

import (
	"fmt"
	"testing"
	"time"
)

func TestEarlyAborts(t *testing.T) {
	const max, ttl = 3, 30 * time.Second
	t0 := time.Unix(1000, 0)
	tests := []struct {
		name  string
		adds  []string // added one second apart from t0
		take  string
		at    time.Duration
		want  bool
		count int
	}{
		{"remembered", []string{"a"}, "a", 2 * time.Second, true, 0},
		{"unknown", []string{"a"}, "b", 2 * time.Second, false, 1},
		{"expired", []string{"a"}, "a", 31 * time.Second, false, 0},
		{"oldest evicted when full", []string{"a", "b", "c", "d"}, "a", 5 * time.Second, false, 3},
		{"newest kept when full", []string{"a", "b", "c", "d"}, "d", 5 * time.Second, true, 2},
		{"repeat does not evict", []string{"a", "b", "c", "c"}, "a", 5 * time.Second, true, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var e earlyAborts
			for i, id := range tt.adds {
				e.add(id, t0.Add(time.Duration(i)*time.Second), max, ttl)
			}
			if got := e.take(tt.take, t0.Add(tt.at), ttl); got != tt.want {
				t.Errorf("take(%q) = %v, want %v", tt.take, got, tt.want)
			}
			if len(e) != tt.count {
				t.Errorf("%d entries left, want %d", len(e), tt.count)
			}
		})
	}
	// The client controls how many aborts it sends: the set stays bounded.
	var e earlyAborts
	for i := range 10000 {
		e.add(fmt.Sprint(i), t0.Add(time.Duration(i)*time.Millisecond), max, ttl)
	}
	if len(e) != max {
		t.Errorf("after 10000 aborts the set holds %d, want %d", len(e), max)
	}
}
