package main

import (
	"context"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// Returning memory after a peak. A burst of turns grows the heap to many times what the
// idle sockets need afterwards (10,000 sockets that each carried a turn: about 400 MiB at
// the peak, 80 to 100 MiB in use a minute later). The runtime keeps the difference: garbage
// until the next collection, which idle sockets' heartbeats trigger only after minutes, and
// free heap, which its scavenger returns slowly and only down to about 110% of the next
// collection's goal. So every trimInterval the process looks at its heap, and when it holds
// trimMinGain more than after its last return (or at its start) and allocated little since
// the last look (the peak is over), it collects and returns the free heap to the system at
// once (debug.FreeOSMemory). Under load the allocation rate keeps it from running; idle, it
// runs after each peak, then whenever the heartbeats' garbage has grown the heap by
// trimMinGain (at 10,000 sockets about once a minute): one forced collection at a time.
const (
	trimInterval = 30 * time.Second
	trimMinGain  = 32 << 20
)

// Runtime metrics the trimmer reads.
var trimSamples = []metrics.Sample{
	{Name: "/gc/heap/allocs:bytes"},              // allocated since the process started
	{Name: "/memory/classes/heap/objects:bytes"}, // objects, live or not yet collected
	{Name: "/memory/classes/heap/unused:bytes"},  // in spans in use, unoccupied
	{Name: "/memory/classes/heap/free:bytes"},    // free, not returned to the system
}

// heapState is what the trimmer reads of the runtime.
type heapState struct {
	allocs uint64 // allocated since the process started
	held   uint64 // heap backed by memory: objects, unused span room and free heap
}

func readHeap() heapState {
	s := make([]metrics.Sample, len(trimSamples))
	copy(s, trimSamples)
	metrics.Read(s)
	return heapState{
		allocs: s[0].Value.Uint64(),
		held:   s[1].Value.Uint64() + s[2].Value.Uint64() + s[3].Value.Uint64(),
	}
}

// trimmer decides, from one look at the heap to the next, whether to return memory.
type trimmer struct {
	last  heapState // the last look
	floor uint64    // the least heap held since the last return
}

func newTrimmer() *trimmer {
	now := readHeap()
	return &trimmer{last: now, floor: now.held}
}

// shouldTrim reports whether the heap now, after the last look, is worth trimming: it holds
// at least trimMinGain beyond its floor, and what was allocated since the last look is
// under a quarter of what it holds (the load that needed it has passed).
func (t *trimmer) shouldTrim(now heapState) bool {
	quiet := now.allocs-t.last.allocs < now.held/4
	t.last = now
	t.floor = min(t.floor, now.held)
	return quiet && now.held > t.floor+trimMinGain
}

// step looks at the heap and trims it if it should; it returns the heap held before and
// after, equal if it did not trim.
func (t *trimmer) step() (before, after uint64) {
	now := readHeap()
	if !t.shouldTrim(now) {
		return now.held, now.held
	}
	debug.FreeOSMemory()
	t.last = readHeap()
	t.floor = t.last.held
	return now.held, t.last.held
}

// returnMemory runs the trimmer every trimInterval until ctx ends, logging each return.
func returnMemory(ctx context.Context, log *slog.Logger) {
	t := newTrimmer()
	tick := time.NewTicker(trimInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if before, after := t.step(); after < before {
			log.Debug("returned free heap to the system", "held_before_mib", before>>20, "held_after_mib", after>>20)
		}
	}
}
