package threadstore

import (
	"sync"
	"time"
)

// A thread update decodes the thread's value and writes it back encoded. A turn updates its
// thread twice (AcceptRun, FinishRun) and reads it once ahead of that (ReadThreadAhead), and
// the turns of a conversation usually run on one gateway one after the other: each read would
// decode what this store has just written. So the store keeps what an update wrote, decoded,
// for the next update or read ahead of the thread, which takes it if the thread's value is
// still the one it wrote (the same revision) instead of decoding that value again. What is
// kept is owned by whoever takes it, as a threadHold hands its value on; it is kept at most
// keptFor, and at most keptBytes of it (by the size of the values' JSON).

// keptFor and keptBytes bound what a store keeps of the values it wrote.
const (
	keptFor   = 2 * time.Second
	keptBytes = 8 << 20
)

// ThreadsKeptFor is the longest a store keeps a thread value it wrote, decoded, for the
// thread's next update: keptFor, and as long again until the sweep that forgets it.
const ThreadsKeptFor = 2 * keptFor

// threadKeep is what a store keeps of the thread values it wrote.
type threadKeep struct {
	mu    sync.Mutex
	by    map[string]keptThread
	order []keptKey // in order of keeping; an entry taken or replaced since is skipped
	size  int       // bytes kept
	timer *time.Timer
}

type keptThread struct {
	r  *threadRead
	at time.Time
}

type keptKey struct {
	key string
	at  time.Time
}

// keep keeps r, what an update of key wrote, for takeKept.
func (k *threadKeep) keep(key string, r *threadRead) {
	if r.size > keptBytes {
		return
	}
	now := time.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.by == nil {
		k.by = map[string]keptThread{}
	}
	k.dropLocked(key)
	k.by[key] = keptThread{r: r, at: now}
	k.size += r.size
	k.order = append(k.order, keptKey{key, now})
	k.trimLocked(now)
	if k.timer == nil {
		k.timer = time.AfterFunc(keptFor, k.sweep)
	}
}

// take returns what was kept of key if it is the value of revision rev or of a later one (the
// value read was read before this store's write: a read ahead of the thread's update), and
// forgets it.
func (k *threadKeep) take(key string, rev uint64) *threadRead {
	k.mu.Lock()
	defer k.mu.Unlock()
	e, ok := k.by[key]
	if !ok {
		return nil
	}
	k.dropLocked(key)
	if e.r.rev < rev {
		return nil
	}
	return e.r
}

// forget forgets what was kept of key.
func (k *threadKeep) forget(key string) {
	k.mu.Lock()
	k.dropLocked(key)
	k.mu.Unlock()
}

func (k *threadKeep) dropLocked(key string) {
	if e, ok := k.by[key]; ok {
		delete(k.by, key)
		k.size -= e.r.size
	}
}

// trimLocked forgets, oldest first, what is older than keptFor and what exceeds keptBytes.
func (k *threadKeep) trimLocked(now time.Time) {
	n := 0
	for ; n < len(k.order); n++ {
		o := k.order[n]
		e, ok := k.by[o.key]
		current := ok && e.at.Equal(o.at)
		if current && now.Sub(o.at) < keptFor && k.size <= keptBytes {
			break
		}
		if current {
			k.dropLocked(o.key)
		}
	}
	k.order = k.order[n:]
}

// sweep forgets what has been kept too long, and comes again while anything is kept.
func (k *threadKeep) sweep() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.trimLocked(time.Now())
	k.timer = nil
	if len(k.order) > 0 {
		k.timer = time.AfterFunc(keptFor, k.sweep)
	}
}
