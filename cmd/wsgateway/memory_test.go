package main

import (
	"testing"
	"time"
)

func TestShouldTrim(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name  string
		floor uint64
		now   heapState
		trims bool
	}{
		{"after a peak", 80 * mib, heapState{allocs: 1010 * mib, held: 300 * mib}, true},
		{"under load", 80 * mib, heapState{allocs: 1200 * mib, held: 300 * mib}, false},
		{"little to gain", 80 * mib, heapState{allocs: 1001 * mib, held: 100 * mib}, false},
	} {
		tr := &trimmer{last: heapState{allocs: 1000 * mib, held: c.floor}, floor: c.floor}
		if got := tr.shouldTrim(c.now); got != c.trims {
			t.Errorf("%s: shouldTrim = %v, want %v", c.name, got, c.trims)
		}
		if tr.last != c.now {
			t.Errorf("%s: the trimmer did not keep its look", c.name)
		}
	}
}

// TestTrimmerReturnsPeak makes a peak of 256 MiB of small objects between two looks, drops
// them and takes a step: the heap the process holds falls back near where it was.
func TestTrimmerReturnsPeak(t *testing.T) {
	tr := newTrimmer()
	func() {
		peak := make([][]byte, 0, 256<<10)
		for range cap(peak) {
			peak = append(peak, make([]byte, 1024))
		}
		if tr.shouldTrim(readHeap()) {
			t.Error("the trimmer would trim while the heap grows")
		}
	}()
	start := time.Now()
	before, after := tr.step()
	t.Logf("heap held: %d MiB before the step, %d MiB after; the step took %v", before>>20, after>>20, time.Since(start))
	if before < 256<<20 {
		t.Fatalf("the peak did not show: %d MiB held", before>>20)
	}
	if after > before-192<<20 {
		t.Errorf("the step returned %d MiB of a %d MiB peak", (before-after)>>20, before>>20)
	}
}
