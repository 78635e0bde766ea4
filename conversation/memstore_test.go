package conversation_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/wsgateway/wsgateway/conversation"
	"github.com/wsgateway/wsgateway/protocol"
)

// memStore is a conversation.Store in memory, for the tests in which NATS is beside the
// point (frames, heartbeats, per-socket limits): one process's run logs, no durability. It
// keeps jetstream's contract as the Server relies on it: a run belongs to the principal that
// created it (ErrForbidden for another), a resubmit starts a new generation and fences the
// old writer, offsets of an older generation or past the end are ErrInvalidOffset, readers
// follow a log until it is closed (io.EOF), and stored callbacks come in append order from
// the log's own goroutine.
type memStore struct {
	mu       sync.Mutex
	runs     map[string]*memRun // by runID
	aborts   []func(principal, runID, origin string, interrupt bool)
	subs     map[string]map[int]func(conversation.Announcement)
	nextSub  int
	queriers []func(key string) []conversation.Announcement
}

// memRun is one run's log: its current generation's events.
type memRun struct {
	principal, threadID string
	gen                 uint64
	events              []conversation.Entry
	closed              bool
	changed             chan struct{} // closed and replaced at every append and at the close
	writer              *memLog
}

// Errors of a memLog: appended after its close, and fenced out by a resubmit.
var (
	errMemClosed = errors.New("memstore: the log is closed")
	errMemFenced = errors.New("memstore: a resubmit took the run")
)

func newMemStore() *memStore {
	return &memStore{runs: map[string]*memRun{}, subs: map[string]map[int]func(conversation.Announcement){}}
}

var _ conversation.Store = (*memStore)(nil)

func (s *memStore) Create(_ context.Context, principal, runID, threadID string, _ []byte) (conversation.RunLog, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.runs[runID]
	switch {
	case r == nil:
		r = &memRun{principal: principal, threadID: threadID, changed: make(chan struct{})}
		s.runs[runID] = r
	case r.principal != principal:
		return nil, conversation.ErrForbidden
	default: // a resubmit: a new generation, the old writer fenced out
		r.writer.fence()
		r.events, r.closed = nil, false
		r.notifyLocked()
	}
	r.gen++
	w := &memLog{s: s, run: r, gen: r.gen, queue: make(chan memAppend, 1<<12), done: make(chan struct{}), lost: make(chan struct{}),
		info: conversation.RunInfo{Principal: principal, RunID: runID, Generation: r.gen}}
	r.writer = w
	go w.loop()
	return w, nil
}

// notifyLocked wakes the readers of r.
func (r *memRun) notifyLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// offset mints the offset of the event at index i of generation gen.
func offset(gen uint64, i int) string { return fmt.Sprintf("g%d.%010d", gen, i) }

// position returns the index after which a read of r from after starts.
func (r *memRun) position(after string) (int, error) {
	switch after {
	case conversation.FromStart:
		return 0, nil
	case conversation.FromNow:
		return len(r.events), nil
	}
	var gen uint64
	var i int
	if _, err := fmt.Sscanf(after, "g%d.%d", &gen, &i); err != nil || gen != r.gen || i < 0 || i >= len(r.events) || offset(gen, i) != after {
		return 0, conversation.ErrInvalidOffset
	}
	return i + 1, nil
}

func (s *memStore) run(principal, runID string) (*memRun, error) {
	r := s.runs[runID]
	if r == nil || r.principal != principal {
		return nil, conversation.ErrUnknownRun
	}
	return r, nil
}

func (s *memStore) Read(_ context.Context, principal, runID, after string) (conversation.LogReader, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.run(principal, runID)
	if err != nil {
		return nil, err
	}
	next, err := r.position(after)
	if err != nil {
		return nil, err
	}
	if after == conversation.FromNow {
		after = conversation.FromStart
		if next > 0 {
			after = r.events[next-1].Offset
		}
	}
	return &memReader{s: s, run: r, gen: r.gen, next: next, after: after, closed: make(chan struct{})}, nil
}

func (s *memStore) LastEvent(ctx context.Context, principal, runID string) ([]byte, error) {
	for {
		s.mu.Lock()
		r, err := s.run(principal, runID)
		if err != nil {
			s.mu.Unlock()
			return nil, err
		}
		if r.closed {
			defer s.mu.Unlock()
			if len(r.events) == 0 {
				return nil, nil
			}
			return r.events[len(r.events)-1].Event, nil
		}
		changed := r.changed
		s.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (s *memStore) Snapshot(_ context.Context, principal, runID string) ([]conversation.Entry, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.run(principal, runID)
	if err != nil {
		return nil, false, err
	}
	return append([]conversation.Entry(nil), r.events...), r.closed, nil
}

func (s *memStore) Ended(_ context.Context, principal, runID string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.run(principal, runID)
	if err != nil {
		return false, err
	}
	n := len(r.events)
	return r.closed || n > 0 && isTerminal(r.events[n-1].Event), nil
}

func (s *memStore) RequestAbort(principal, runID, origin string) error {
	return s.requestStop(principal, runID, origin, false)
}

func (s *memStore) RequestInterrupt(principal, runID string) error {
	return s.requestStop(principal, runID, "", true)
}

func (s *memStore) requestStop(principal, runID, origin string, interrupt bool) error {
	s.mu.Lock()
	fs := slices.Clone(s.aborts)
	s.mu.Unlock()
	go func() {
		for _, f := range fs {
			f(principal, runID, origin, interrupt)
		}
	}()
	return nil
}

func (s *memStore) OnAbort(f func(principal, runID, origin string, interrupt bool)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.aborts = append(s.aborts, f)
	return nil
}

// OnTakeover keeps nothing: a memStore's process never dies under its runs.
func (s *memStore) OnTakeover(func(conversation.Takeover) bool) {}

func (s *memStore) ThreadKey(principal, threadID string) string {
	return strconv.Quote(principal) + "/" + strconv.Quote(threadID)
}

func (s *memStore) Announce(key string, run conversation.Announcement) error {
	s.mu.Lock()
	var fs []func(conversation.Announcement)
	for _, f := range s.subs[key] {
		fs = append(fs, f)
	}
	s.mu.Unlock()
	go func() {
		for _, f := range fs {
			f(run)
		}
	}()
	return nil
}

func (s *memStore) SubscribeThread(key string, f func(conversation.Announcement)) (func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.subs[key] == nil {
		s.subs[key] = map[int]func(conversation.Announcement){}
	}
	id := s.nextSub
	s.nextSub++
	s.subs[key][id] = f
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.subs[key], id)
	}, nil
}

func (s *memStore) QueryThread(key string, _ time.Duration, f func([]conversation.Announcement)) (func(), error) {
	s.mu.Lock()
	qs := slices.Clone(s.queriers)
	s.mu.Unlock()
	go func() {
		for _, q := range qs {
			if runs := q(key); runs != nil {
				f(runs)
			}
		}
	}()
	return func() {}, nil
}

func (s *memStore) OnThreadQuery(running func(key string) []conversation.Announcement) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queriers = append(s.queriers, running)
	return nil
}

// memLog is a memRun's writer for one generation.
type memLog struct {
	s     *memStore
	run   *memRun
	gen   uint64
	info  conversation.RunInfo
	queue chan memAppend
	done  chan struct{} // closed when loop has returned
	lost  chan struct{}
	err   atomic.Pointer[error] // set once: why the writer failed
	fail  sync.Once

	mu      sync.Mutex // held while an append or the close is queued
	closing bool
}

type memAppend struct {
	event  []byte
	stored func(string, error)
	close  chan struct{} // a Close's marker: closed once every append before it is done
}

// loop stores the appends in order, and calls their stored callbacks.
func (w *memLog) loop() {
	defer close(w.done)
	for a := range w.queue {
		if a.close != nil {
			w.s.mu.Lock()
			if w.Err() == nil && w.run.gen == w.gen {
				w.run.closed = true
				w.run.notifyLocked()
			}
			w.s.mu.Unlock()
			close(a.close)
			return
		}
		w.s.mu.Lock()
		err := w.Err()
		var off string
		if err == nil {
			off = offset(w.gen, len(w.run.events))
			w.run.events = append(w.run.events, conversation.Entry{Offset: off, Event: append([]byte(nil), a.event...)})
			w.run.notifyLocked()
		}
		w.s.mu.Unlock()
		a.stored(off, err)
	}
}

func (w *memLog) Append(event []byte, stored func(string, error)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closing {
		stored("", errMemClosed)
		return
	}
	w.queue <- memAppend{event: event, stored: stored}
}

func (w *memLog) WaitRoom(context.Context) error { return w.Err() }

func (w *memLog) Lost() <-chan struct{} { return w.lost }

func (w *memLog) Err() error {
	if err := w.err.Load(); err != nil {
		return *err
	}
	return nil
}

func (w *memLog) Info() conversation.RunInfo { return w.info }

// fence fails the writer: a resubmit took its run.
func (w *memLog) fence() {
	w.fail.Do(func() {
		err := errMemFenced
		w.err.Store(&err)
		close(w.lost)
	})
}

func (w *memLog) Close(ctx context.Context) error {
	w.mu.Lock()
	if w.closing {
		w.mu.Unlock()
		return errMemClosed
	}
	w.closing = true
	flushed := make(chan struct{})
	w.queue <- memAppend{close: flushed}
	w.mu.Unlock()
	select {
	case <-flushed:
		return w.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// memReader reads a memRun's generation gen from next on.
type memReader struct {
	s      *memStore
	run    *memRun
	gen    uint64
	next   int
	after  string
	closed chan struct{}
	once   sync.Once
}

func (r *memReader) Next(ctx context.Context) (conversation.Entry, error) {
	for {
		r.s.mu.Lock()
		switch {
		case r.run.gen != r.gen:
			r.s.mu.Unlock()
			return conversation.Entry{}, conversation.ErrInvalidOffset
		case r.next < len(r.run.events):
			e := r.run.events[r.next]
			r.next++
			r.s.mu.Unlock()
			return e, nil
		case r.run.closed:
			r.s.mu.Unlock()
			return conversation.Entry{}, io.EOF
		}
		changed := r.run.changed
		r.s.mu.Unlock()
		select {
		case <-changed:
		case <-r.closed:
			return conversation.Entry{}, errMemClosed
		case <-ctx.Done():
			return conversation.Entry{}, ctx.Err()
		}
	}
}

func (r *memReader) After() string { return r.after }

func (r *memReader) TraceContext() trace.SpanContext { return trace.SpanContext{} }

func (r *memReader) Close() error {
	r.once.Do(func() { close(r.closed) })
	return nil
}

// isTerminal reports whether event is a RUN_FINISHED or a RUN_ERROR.
func isTerminal(event []byte) bool {
	_, ended := protocol.EndOf(event)
	return ended
}
