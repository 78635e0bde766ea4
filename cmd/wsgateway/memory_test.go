package main

import (
	"fmt"
	"runtime"
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

func TestShouldCollect(t *testing.T) {
	const mib = 1 << 20
	last := heapState{allocs: 1000 * mib}
	for _, c := range []struct {
		name     string
		now      heapState
		collects bool
	}{
		{"idle, garbage past the slack", heapState{allocs: 1002 * mib, held: 120 * mib, objects: 90 * mib, live: 60 * mib}, true},
		{"under load", heapState{allocs: 1020 * mib, held: 120 * mib, objects: 90 * mib, live: 60 * mib}, false},
		{"idle, garbage within the slack", heapState{allocs: 1002 * mib, held: 120 * mib, objects: 70 * mib, live: 60 * mib}, false},
		{"idle, a small heap", heapState{allocs: 1000 * mib, held: 20 * mib, objects: 12 * mib, live: 4 * mib}, false},
	} {
		g := &idleCollector{last: last}
		if got := g.shouldCollect(c.now); got != c.collects {
			t.Errorf("%s: shouldCollect = %v, want %v", c.name, got, c.collects)
		}
		if g.last != c.now {
			t.Errorf("%s: the collector did not keep its look", c.name)
		}
	}
}

// TestIdleCollectorCollects keeps 64 MiB live, makes 48 MiB of garbage, looks, then takes a
// step with nothing allocated in between: the step collects the garbage and, with
// --idle-memory return, returns its pages to the system.
func TestIdleCollectorCollects(t *testing.T) {
	for _, returnFree := range []bool{false, true} {
		t.Run(fmt.Sprintf("return=%v", returnFree), func(t *testing.T) {
			live := make([][]byte, 0, 64<<10)
			for range cap(live) {
				live = append(live, make([]byte, 1024))
			}
			runtime.GC() // the live heap as marked: at least 64 MiB
			for range 48 << 10 {
				sink = make([]byte, 1024)
			}
			g := &idleCollector{last: readHeap(), returnFree: returnFree}
			before := g.last
			if !g.step() {
				t.Fatalf("no collection: %+v", g.last)
			}
			if after := g.last.objects; after > before.objects-32<<20 {
				t.Errorf("objects %d MiB before the step, %d MiB after: the garbage was not collected", before.objects>>20, after>>20)
			}
			if after := g.last.held; returnFree && after > before.held-32<<20 {
				t.Errorf("heap held %d MiB before the step, %d MiB after: the garbage's pages were kept", before.held>>20, after>>20)
			}
			runtime.KeepAlive(live)
		})
	}
}

// sink keeps the compiler from dropping an allocation.
var sink []byte
