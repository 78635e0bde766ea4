package jetstream

import (
	"context"
	"sync"

	natsjs "github.com/nats-io/nats.go/jetstream"
)

// Shared tails: the Readers of one store that follow the live end of the same log share one
// consumer, a tail's, which fans the log's messages out in the process. A tail keeps the last
// tailRing messages it received: a reader whose next message is among them, or is the
// tail's next, attaches to it; a reader further behind reads with its own consumer and
// attaches once it has caught up. A subscriber that falls tailBacklog messages behind is
// detached and goes on with its own consumer from where it was: a slow reader never slows
// the others, and never misses a message. The tail stops, deleting its consumer, when its
// last subscriber leaves or the log's close record went out.
const (
	tailRing    = 256
	tailBacklog = 4096
)

// tailMsg is one message of the log and its stream sequence.
type tailMsg struct {
	msg natsjs.Msg
	seq uint64
}

// tail is the shared consumer of one subject of one stream.
type tail struct {
	s   *Store
	key string // the stream's name and the subject
	src *Reader

	mu   sync.Mutex
	from uint64    // every message of the subject from this sequence on is in ring or to come
	ring []tailMsg // the last messages received, oldest at ring[head] once it is full
	head int
	subs map[*tailSub]struct{}
	done bool // the source ended: no message will come
}

// tailSub is a reader's subscription to a tail.
type tailSub struct {
	t     *tail
	start uint64 // the first sequence it wants
	mu    sync.Mutex
	queue []tailMsg
	wake  chan struct{} // signaled when queue grows or the subscription ends
	ended bool          // detached (too slow) or the tail ended
}

// tailKey names the tail of subject on stream st.
func tailKey(st natsjs.Stream, subject string) string {
	return st.CachedInfo().Config.Name + " " + subject
}

// attach subscribes r to the tail of its log if one covers r.next, starting one at r.next
// when there is none. It reports whether r is now fed by a tail.
func (s *Store) attach(r *Reader) bool {
	key := tailKey(r.st, r.subject)
	s.mu.Lock()
	t := s.tails[key]
	if t == nil {
		if s.closed {
			s.mu.Unlock()
			return false
		}
		t = s.startTail(key, r)
		s.tails[key] = t
	}
	s.mu.Unlock()
	sub := t.subscribe(r.next)
	if sub == nil {
		return false
	}
	r.mu.Lock()
	r.sub = sub
	r.mu.Unlock()
	return true
}

// tailCovers reports whether a shared tail of r's log holds every message from r.next on.
func (s *Store) tailCovers(r *Reader) bool {
	s.mu.Lock()
	t := s.tails[tailKey(r.st, r.subject)]
	s.mu.Unlock()
	if t == nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return !t.done && r.next >= t.from
}

// startTail starts the tail of r's log from r.next. The caller holds s.mu.
func (s *Store) startTail(key string, r *Reader) *tail {
	src := &Reader{s: s, st: r.st, subject: r.subject, tag: r.tag, gen: r.gen, next: r.next, catchTo: r.catchTo, source: true}
	src.ctx, src.cancel = context.WithCancel(s.ctx)
	t := &tail{s: s, key: key, src: src, from: r.next, subs: map[*tailSub]struct{}{}}
	s.wg.Add(1)
	go t.run()
	return t
}

// subscribe returns a subscription delivering every message from sequence next on, or nil
// when the tail does not hold them all.
func (t *tail) subscribe(next uint64) *tailSub {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done || next < t.from {
		return nil
	}
	sub := &tailSub{t: t, start: next, wake: make(chan struct{}, 1)}
	for i := range t.ring {
		if m := t.ring[(t.head+i)%len(t.ring)]; m.seq >= next {
			sub.queue = append(sub.queue, m)
		}
	}
	t.subs[sub] = struct{}{}
	return sub
}

// run receives the log's messages and hands them to the subscribers until the close record,
// the last subscriber's leave, or the store's close.
func (t *tail) run() {
	defer t.s.wg.Done()
	defer t.end()
	for {
		msg, seq, err := t.src.receive(t.src.ctx)
		if err != nil {
			return
		}
		t.src.next = seq + 1
		m := tailMsg{msg: msg, seq: seq}
		t.mu.Lock()
		if len(t.ring) < tailRing {
			t.ring = append(t.ring, m)
		} else {
			t.from = t.ring[t.head].seq + 1
			t.ring[t.head] = m
			t.head = (t.head + 1) % tailRing
		}
		for sub := range t.subs {
			if !sub.push(m) {
				delete(t.subs, sub)
			}
		}
		closed := msg.Headers().Get(hdrCtl) == ctlClose
		t.mu.Unlock()
		if closed {
			return
		}
	}
}

// end stops the tail: its consumer goes, its subscribers read what they have, then go on
// with their own consumers (or see the close record they were given), and no reader
// attaches any more.
func (t *tail) end() {
	t.s.mu.Lock()
	if t.s.tails[t.key] == t {
		delete(t.s.tails, t.key)
	}
	t.s.mu.Unlock()
	t.mu.Lock()
	t.done = true
	subs := t.subs
	t.subs = nil
	t.mu.Unlock()
	for sub := range subs {
		sub.finish()
	}
	t.src.stop()
}

// leave unsubscribes sub; the tail stops when no subscriber is left.
func (t *tail) leave(sub *tailSub) {
	t.mu.Lock()
	delete(t.subs, sub)
	last := len(t.subs) == 0 && !t.done
	t.mu.Unlock()
	if last {
		t.src.cancel() // run returns and ends the tail
	}
}

// push queues m for the subscriber, or ends the subscription (false) when it is too far
// behind. The tail holds t.mu.
func (sub *tailSub) push(m tailMsg) bool {
	if m.seq < sub.start {
		return true
	}
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if len(sub.queue) >= tailBacklog {
		sub.ended = true
		sub.signal()
		return false
	}
	sub.queue = append(sub.queue, m)
	sub.signal()
	return true
}

// finish ends the subscription: the reader takes what is queued, then its own consumer.
func (sub *tailSub) finish() {
	sub.mu.Lock()
	sub.ended = true
	sub.signal()
	sub.mu.Unlock()
}

func (sub *tailSub) signal() {
	select {
	case sub.wake <- struct{}{}:
	default:
	}
}

// next returns the subscription's next message; ok false when the subscription ended and
// its queue is empty (the reader goes on with a consumer of its own). It blocks until a
// message comes, the subscription ends, or ctx ends (err).
func (sub *tailSub) next(ctx context.Context) (m tailMsg, ok bool, err error) {
	for {
		sub.mu.Lock()
		if len(sub.queue) > 0 {
			m = sub.queue[0]
			sub.queue[0] = tailMsg{}
			sub.queue = sub.queue[1:]
			sub.mu.Unlock()
			return m, true, nil
		}
		ended := sub.ended
		sub.mu.Unlock()
		if ended {
			return tailMsg{}, false, nil
		}
		select {
		case <-sub.wake:
		case <-ctx.Done():
			return tailMsg{}, false, ctx.Err()
		}
	}
}
