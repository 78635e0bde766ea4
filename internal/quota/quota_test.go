package quota

import (
	"fmt"
	"testing"
	"time"
)

func TestBucket(t *testing.T) {
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
			var b Bucket
			var r Rates
			got, gotRates := "", ""
			for _, at := range tt.at {
				got += yn(b.Take(at, tt.rate, tt.burst))
				gotRates += yn(r.Take("p", at, tt.rate, tt.burst))
			}
			if got != tt.want || gotRates != tt.want {
				t.Errorf("takes = %s, of Rates %s, want %s", got, gotRates, tt.want)
			}
		})
	}
}

func yn(ok bool) string {
	if ok {
		return "y"
	}
	return "n"
}

func TestCounts(t *testing.T) {
	var c Counts
	for i := 0; i < 3; i++ {
		if !c.Take("a", 3) {
			t.Fatalf("take %d of a under max 3 refused", i+1)
		}
	}
	if c.Take("a", 3) {
		t.Error("a fourth take of a with max 3 allowed")
	}
	if !c.Take("b", 3) {
		t.Error("b refused while a is at its max")
	}
	c.Put("a")
	if !c.Take("a", 3) {
		t.Error("a refused after a Put")
	}
	for i := 0; i < 3; i++ {
		c.Put("a")
	}
	c.Put("b")
	if c.Len() != 0 || c.Held("a") != 0 {
		t.Errorf("after every Put: %d entries, a holds %d; want none", c.Len(), c.Held("a"))
	}
}

// TestRatesForget: a principal's bucket is forgotten once it is full again, so the map
// holds only principals that started something lately, and a principal that started nothing
// for burst/rate seconds has its whole burst.
func TestRatesForget(t *testing.T) {
	var r Rates
	at := time.Hour
	for i := 0; i < 1000; i++ {
		if !r.Take(fmt.Sprintf("p%d", i), at, 10, 2) {
			t.Fatalf("first take of p%d refused", i)
		}
		at += 10 * time.Millisecond // 10 s for the 1000: each bucket is full after 100 ms
	}
	if n := r.Len(); n > 2*minSweep {
		t.Errorf("%d buckets kept after 1000 principals one start each, 10 ms apart; want at most %d", n, 2*minSweep)
	}
	if !r.Take("p999", at, 10, 2) || r.Take("p999", at, 10, 2) {
		t.Error("p999's burst of 2, 10 ms after its first start, is not 1 more then refused")
	}
}
