package conversation

import (
	"testing"
	"time"
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

func TestTurnSetMax(t *testing.T) {
	var ts turnSet
	a, _ := ts.add("a", time.Second, 2)
	if b, _ := ts.add("b", time.Second, 2); a == nil || b == nil {
		t.Fatal("add under the cap refused")
	}
	if c, _ := ts.add("c", time.Second, 2); c != nil {
		t.Error("a third key added with max 2")
	}
	if a2, prev := ts.add("a", time.Second, 2); a2 == nil || prev != a {
		t.Errorf("resubmit of a at the cap = %v, %v; want a new slot replacing a", a2, prev)
	}
	ts.remove(a) // replaced already: nothing happens
	if c, _ := ts.add("c", time.Second, 2); c != nil {
		t.Error("c added while a and b still run")
	}
	if h, _ := ts.add("h", time.Second, 0); h == nil {
		t.Error("max 0 (no cap) refused")
	}
}
