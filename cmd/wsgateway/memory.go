package main

import (
	"context"
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// The memory limit and the budget. In a container, the Go runtime's soft memory limit is set
// to 90% of the cgroup's limit (--memory-limit auto, by automemlimit): the collector then
// runs harder as the heap nears it instead of letting it double past the container's limit,
// which would kill the process. The memory budget (--memory-budget, package budget) bounds
// what clients and agents make the gateway hold; by default a quarter of the memory limit,
// so that with the collector's headroom (the heap grows to about twice what is live before a
// collection, less near the limit) it stays under half of it, leaving the rest to the
// sockets, the embedded NATS server and the runtime. The idle collector and the trimmer below
// work under either: they only collect sooner and return freed pages sooner than the runtime
// would, never hold more.
const (
	memoryLimitRatio     = 0.9
	defaultMemoryBudget  = 128 << 20 // without a memory limit
	memoryBudgetFraction = 4         // of the memory limit
)

// setMemoryLimit sets the Go runtime's soft memory limit as mode says (--memory-limit:
// memoryAuto, memoryOff or a size) and returns the limit in force, 0 for none. Auto takes
// memoryLimitRatio of the container's cgroup limit, and leaves the runtime's own (GOMEMLIMIT)
// where there is none, or where GOMEMLIMIT is set.
func setMemoryLimit(mode int64, log *slog.Logger) int64 {
	switch {
	case mode > 0:
		debug.SetMemoryLimit(mode)
	case mode == memoryAuto:
		if _, err := memlimit.Set(memlimit.WithProvider(memlimit.FromCgroup), memlimit.WithRatio(memoryLimitRatio)); err != nil {
			log.Debug("no container memory limit", keyErr, err)
		}
	}
	limit := debug.SetMemoryLimit(-1)
	if limit == math.MaxInt64 {
		return 0
	}
	return limit
}

// memoryBudget returns the budget --memory-budget asks for (memoryAuto or a size) under the
// memory limit in force (0 for none).
func memoryBudget(mode, limit int64) int64 {
	switch {
	case mode > 0:
		return mode
	case limit > 0:
		return limit / memoryBudgetFraction
	}
	return defaultMemoryBudget
}

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

// Keeping the heap tight while idle. Idle sockets allocate little but steadily: each
// heartbeat leaves about 2 KB of garbage per socket (coder/websocket's handling of the ping
// and of its pong). With the default GOGC the heap grows to twice what the last collection
// left live before the next one, and the process keeps the pages it grew into: 10,000 fresh
// sockets went from 8.3 to 13.0 KiB each over two minutes of heartbeats. So every
// idleLookInterval the process looks at its heap, and when it allocated under a sixteenth of
// the heap it holds since the last look (idle: heartbeats, a few turns) and its objects
// exceed what the last collection left live by a quarter (idleSlack), it collects. Under
// load it does nothing: collections are the pacer's (GOGC), and a burst that follows an
// idle spell meets at most one of these. Below idleMinLive of live heap it does nothing
// either: the memory saved would not be worth a collection.
//
// A collection alone leaves the runtime keeping the freed pages, up to about 110% of its
// next goal (twice the live heap), for the next turns to reuse (--idle-memory keep: 5,000
// sockets after a turn hold 9.4 to 10.6 KiB each). By default (--idle-memory return)
// the collection also returns them to the system (about 7.7 KiB each), and the next turns
// fault in every page they grow into again: cheap on most hosts (well under a microsecond
// a page), 12 to 17 µs a page on the virtual machine the benchmarks ran on, where a burst
// of 100 turns after an idle spell took up to 0.1 s more of the gateway's CPU, its first
// events within the spread of one run to the next (BENCHMARKS.md).
const (
	idleLookInterval = time.Second
	idleSlack        = 4 // objects may exceed the live heap by a quarter of it
	idleMinLive      = 16 << 20
)

// Runtime metrics the trimmer and the idle collector read.
var heapSamples = []metrics.Sample{
	{Name: "/gc/heap/allocs:bytes"},              // allocated since the process started
	{Name: "/memory/classes/heap/objects:bytes"}, // objects, live or not yet collected
	{Name: "/memory/classes/heap/unused:bytes"},  // in spans in use, unoccupied
	{Name: "/memory/classes/heap/free:bytes"},    // free, not returned to the system
	{Name: "/gc/heap/live:bytes"},                // live objects as the last collection marked them
}

// heapState is what the trimmer and the idle collector read of the runtime.
type heapState struct {
	allocs  uint64 // allocated since the process started
	held    uint64 // heap backed by memory: objects, unused span room and free heap
	objects uint64 // objects, live or not yet collected
	live    uint64 // live objects at the last collection
}

func readHeap() heapState {
	s := make([]metrics.Sample, len(heapSamples))
	copy(s, heapSamples)
	metrics.Read(s)
	return heapState{
		allocs:  s[0].Value.Uint64(),
		held:    s[1].Value.Uint64() + s[2].Value.Uint64() + s[3].Value.Uint64(),
		objects: s[1].Value.Uint64(),
		live:    s[4].Value.Uint64(),
	}
}

// idleCollector decides, from one look at the heap to the next, whether to collect.
type idleCollector struct {
	last       heapState // the last look
	returnFree bool      // return the free heap after each collection (--idle-memory return)
}

// shouldCollect reports whether the heap now, after the last look, calls for a collection:
// the process was idle since the last look and its garbage passed idleSlack.
func (g *idleCollector) shouldCollect(now heapState) bool {
	idle := now.allocs-g.last.allocs < now.held/16
	g.last = now
	return idle && now.live >= idleMinLive && now.objects > now.live+now.live/idleSlack
}

// step looks at the heap and collects if it should, returning the free heap to the system
// if it is to; it reports whether it collected.
func (g *idleCollector) step() bool {
	if !g.shouldCollect(readHeap()) {
		return false
	}
	if g.returnFree {
		debug.FreeOSMemory()
	} else {
		runtime.GC()
	}
	g.last = readHeap()
	return true
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

// returnMemory runs the trimmer every trimInterval and the idle collector every
// idleLookInterval until ctx ends, logging each return; with returnFree the idle collector
// returns the heap it frees.
func returnMemory(ctx context.Context, log *slog.Logger, returnFree bool) {
	t := newTrimmer()
	g := &idleCollector{last: readHeap(), returnFree: returnFree}
	trim := time.NewTicker(trimInterval)
	defer trim.Stop()
	look := time.NewTicker(idleLookInterval)
	defer look.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-look.C:
			g.step()
		case <-trim.C:
			if before, after := t.step(); after < before {
				log.Debug("returned free heap to the system", "held_before_mib", before>>20, "held_after_mib", after>>20)
			}
		}
	}
}
