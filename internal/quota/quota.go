// Package quota bounds what one principal takes of a gateway. Counts counts what each
// principal holds at once (its sockets, running turns, hydrates, readers) and refuses beyond a
// maximum; Rates meters what each principal starts, with a token bucket per principal. Both
// keep a map entry only for a principal that holds something, or whose bucket is not full:
// an idle principal costs nothing. Bucket is one token bucket, for a rate of one socket.
// Pause slows a client that goes on asking beyond its bounds.
package quota

import (
	"context"
	"sync"
	"time"
)

// DefaultPause is the default of the gateway's refusal delay (Pause): a client over its
// bounds is told no in half a second, which an honest one, told to wait anyway, hardly
// notices, and a flood is slowed to two refusals a second per connection.
const DefaultPause = 500 * time.Millisecond

// Pause waits d, or until ctx is done, before a refusal by a bound is answered (or, on a
// socket, before its next frame is read). A client that waits for each answer before it asks
// again (a request of an HTTP/1.1 connection, a frame of a paused socket) is slowed to one
// refusal per d per connection: a flood beyond its bounds then costs the gateway little CPU
// beside its other principals, where answering at once would let it take a core refusing.
// d <= 0: no pause.
func Pause(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// Counts counts, per principal, what it holds at once. The zero value is empty and ready;
// it is safe for concurrent use.
type Counts struct {
	mu sync.Mutex
	n  map[string]int
}

// Take counts one more for principal unless it holds max already, and reports whether it
// did. Put undoes it.
func (c *Counts) Take(principal string, max int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n[principal]
	if n >= max {
		return false
	}
	if c.n == nil {
		c.n = make(map[string]int)
	}
	c.n[principal] = n + 1
	return true
}

// Put forgets one of principal's; a principal that holds none has no entry.
func (c *Counts) Put(principal string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.n[principal]; n > 1 {
		c.n[principal] = n - 1
	} else {
		delete(c.n, principal)
	}
}

// Held returns what principal holds.
func (c *Counts) Held(principal string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[principal]
}

// Len returns how many principals hold something.
func (c *Counts) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.n)
}

// Bucket limits a rate of events: tokens fill at a rate per second up to a burst, and each
// event takes one. The zero value is a full bucket. It has no timer: Take refills it from the
// time elapsed since the previous call. 16 bytes.
type Bucket struct {
	tokens float64       // tokens missing from a full bucket, as of at
	at     time.Duration // Now() of the previous take; zero: never
}

// monoStart is the origin of Now.
var monoStart = time.Now()

// Now returns the time on the monotonic clock, positive: the clock of Take.
func Now() time.Duration { return time.Since(monoStart) + 1 }

// Take reports whether an event at now (Now) fits, and counts it if so. A refused event
// costs nothing.
func (b *Bucket) Take(now time.Duration, rate float64, burst int) bool {
	if b.at != 0 {
		b.tokens -= (now - b.at).Seconds() * rate
		if b.tokens < 0 {
			b.tokens = 0
		}
	}
	b.at = now
	if b.tokens+1 > float64(burst) {
		return false
	}
	b.tokens++
	return true
}

// wait returns how long after its last take the bucket holds a token again at rate (0: it
// holds one).
func (b *Bucket) wait(rate float64, burst int) time.Duration {
	return time.Duration(max(b.tokens+1-float64(burst), 0) / rate * float64(time.Second))
}

// full returns when the bucket is full again at rate.
func (b *Bucket) full(rate float64) time.Duration {
	return b.at + time.Duration(b.tokens/rate*float64(time.Second))
}

// Rates holds a Bucket per principal. The zero value is ready; it is safe for concurrent
// use. A bucket that is full again is forgotten (it is a zero Bucket): every so many new
// entries, the map is swept, so it holds about the principals that started something within
// the last burst/rate seconds.
type Rates struct {
	mu      sync.Mutex
	buckets map[string]rateEntry
	sweepAt int // the map's size that triggers the next sweep
}

type rateEntry struct {
	Bucket
	fullAt time.Duration
}

// minSweep is the smallest map that is swept.
const minSweep = 64

// Wait returns how long after its last Take principal's bucket holds a token again (0: it
// holds one, or it has no bucket): after a refused Take, when a start fits again.
func (r *Rates) Wait(principal string, rate float64, burst int) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.buckets[principal]
	if !ok {
		return 0
	}
	return e.Bucket.wait(rate, burst)
}

// Take reports whether a start of principal at now fits its bucket (rate per second, up to
// burst), and counts it if so.
func (r *Rates) Take(principal string, now time.Duration, rate float64, burst int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.buckets[principal]
	if ok && now >= e.fullAt {
		e = rateEntry{} // full again: as new
	}
	taken := e.Bucket.Take(now, rate, burst)
	e.fullAt = e.Bucket.full(rate)
	if r.buckets == nil {
		r.buckets = make(map[string]rateEntry)
	}
	r.buckets[principal] = e
	if !ok && len(r.buckets) >= max(r.sweepAt, minSweep) {
		for p, e := range r.buckets {
			if now >= e.fullAt {
				delete(r.buckets, p)
			}
		}
		r.sweepAt = 2 * len(r.buckets)
	}
	return taken
}

// Len returns how many principals have a bucket.
func (r *Rates) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.buckets)
}
