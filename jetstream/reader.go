package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	nats "github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/wsgateway/wsgateway/internal/tracing"
)

// Entry is one stored event and its offset.
type Entry struct {
	Offset string
	Event  []byte
}

// Offsets accepted by Read besides minted ones.
const (
	FromStart = "-1"
	FromNow   = "now"
)

// Reader reads one run's log in order. It is not safe for concurrent use; Close may be called
// from another goroutine to stop a blocked Next.
//
// A Reader follows the log through a consumer of its own (an ephemeral, in-memory, R1 pull
// consumer filtered to the run's subject) that it replaces, starting right after the last
// message it read, whenever the consumer fails: its heartbeats stop (its server died), the
// server deleted it, it skipped a message, or it stays silent for the idle bound (5s) while
// the log holds messages it has not delivered (it is stuck). While the stream is unavailable
// it keeps trying, with backoff, each attempt under a new name: a name whose creation got no
// answer may be assigned to a server that is gone.
type Reader struct {
	s       *Store
	st      natsjs.Stream // the stream the run's log is on
	subject string
	tag     string
	gen     uint64
	next    uint64 // the stream sequence to read from: one past the last message read
	pending []Entry
	eof     bool
	stopAt  uint64 // when non-zero: EOF after the message of this sequence (Snapshot)
	// catchTo is the log's last sequence when the reader opened, when the reader started
	// before it: the reader reads up to it in a shared pass (see catchup.go); 0 once done.
	catchTo uint64
	backlog []tailMsg // what the pass read, not yet returned
	// behindTo is the log's last sequence when the reader opened behind it, and counted
	// says the reader is among the store's readers behind (Store.behind) until it has read
	// that far or is closed.
	behindTo uint64
	counted  atomic.Bool
	// sawClose says the close record was read; closedAfter is its hdrAfter, once the reader
	// met the close record (0 when it names none).
	sawClose    bool
	closedAfter uint64
	// after is the offset the reader reads after, FromNow resolved (see After).
	after string
	// traced is the run's trace context (RunInfo.TraceParent), see TraceContext.
	traced trace.SpanContext

	// ctx is canceled by Close and by the store's Close: it aborts the consumer's creation.
	ctx    context.Context
	cancel context.CancelFunc

	// source says the reader is a shared tail's (see tail.go), which never attaches to one.
	source bool

	mu sync.Mutex // guards it, cons, sub and closed, which Close reads from another goroutine
	// sub feeds the reader from its log's shared tail instead of a consumer of its own; nil
	// while it reads with its own.
	sub    *tailSub
	it     natsjs.MessagesContext
	cons   string // the consumer's name
	closed bool

	dseq uint64 // the consumer sequence of the last message the consumer delivered
}

// lookup returns the run's metadata for principal. Another principal's run is reported
// exactly like a missing one.
func (s *Store) lookup(ctx context.Context, principal, runID string) (RunInfo, error) {
	e, err := s.meta.Get(ctx, runKey(runID))
	if errors.Is(err, natsjs.ErrKeyNotFound) {
		return RunInfo{}, ErrUnknownRun
	}
	if err != nil {
		return RunInfo{}, err
	}
	var info RunInfo
	if err := json.Unmarshal(e.Value(), &info); err != nil {
		return RunInfo{}, fmt.Errorf("metadata: %w", err)
	}
	if info.Principal != principal || info.RunID != runID {
		return RunInfo{}, ErrUnknownRun
	}
	return info, nil
}

// Run returns the run's metadata. ErrUnknownRun when there is no such run for principal.
func (s *Store) Run(ctx context.Context, principal, runID string) (RunInfo, error) {
	info, err := s.lookup(ctx, principal, runID)
	if err != nil {
		return RunInfo{}, fmt.Errorf("run: %w", err)
	}
	return info, nil
}

// Ended reports whether the run has stored its terminal (RUN_FINISHED or RUN_ERROR) or
// closed its log, without waiting and without reading the log: its metadata, and the last
// message of its subject. ErrUnknownRun as Run's.
func (s *Store) Ended(ctx context.Context, principal, runID string) (bool, error) {
	info, err := s.lookup(ctx, principal, runID)
	if err != nil {
		return false, fmt.Errorf("ended: %w", err)
	}
	if info.State != RunOpen {
		return true, nil
	}
	sh, err := s.shard(ctx, info.Stream)
	if err != nil {
		return false, fmt.Errorf("ended: %w", err)
	}
	subject, _ := sh.subject(info.Principal, info.RunID)
	m, err := lastMsg(ctx, sh.stream, subject)
	if err != nil || m == nil || msgGen(m.Header) != info.Generation {
		return false, err
	}
	return m.Header.Get(hdrCtl) == ctlClose || endsWithTerminal(m), nil
}

// lastMsg returns the last message of subject on st, or nil when it has none.
func lastMsg(ctx context.Context, st natsjs.Stream, subject string) (*natsjs.RawStreamMsg, error) {
	m, err := st.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return nil, nil
	}
	return m, err
}

// Read opens a reader strictly after `after`: an offset this package minted, FromStart ("-1")
// or FromNow ("now"). Errors: ErrUnknownRun (no such run for this principal, or aged out; the
// same for another principal's run), ErrInvalidOffset (malformed, foreign, stale, or past the
// end). A FromStart read of a run with no log yet waits up to JoinWait for it.
func (s *Store) Read(ctx context.Context, principal, runID, after string) (*Reader, error) {
	r, err := s.open(ctx, principal, runID, after, false)
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	return r, nil
}

func (s *Store) open(ctx context.Context, principal, runID, after string, snapshot bool) (*Reader, error) {
	var pos position
	if after != FromStart && after != FromNow {
		var err error
		if pos, err = parseOffset(after); err != nil {
			return nil, err
		}
	}
	// A join may precede the run's creation; a resume from an offset of this stream may be
	// served by a bucket replica that has not applied the run's metadata yet (KV gets are
	// direct gets): both wait up to JoinWait for the run to appear.
	wait := (after == FromStart && !snapshot) || (after != FromNow && s.knownTag(pos.tag, logKey(principal, runID)))
	info, err := s.awaitRun(ctx, principal, runID, wait)
	if err != nil {
		return nil, err
	}
	sh, err := s.shard(ctx, info.Stream)
	if err != nil {
		return nil, err
	}
	subject, tag := sh.subject(principal, runID)
	info, last, err := s.lastOfGeneration(ctx, principal, runID, sh.stream, subject, info)
	if err != nil {
		return nil, err
	}
	r := &Reader{s: s, st: sh.stream, subject: subject, tag: tag, gen: info.Generation, after: after}
	if info.TraceParent != "" {
		r.traced = tracing.Parse(info.TraceParent, info.TraceState)
	}
	if snapshot {
		if last == nil {
			r.eof = true
			return r, nil
		}
		r.stopAt = last.Sequence
	}
	switch after {
	case FromStart:
		r.next = 1
	case FromNow:
		r.startAtTail(last)
	default:
		if err := r.startAfter(ctx, pos); err != nil {
			return nil, err
		}
	}
	if r.eof {
		return r, nil
	}
	if last != nil && r.next <= last.Sequence {
		r.catchTo, r.behindTo = last.Sequence, last.Sequence
		r.counted.Store(true)
		s.behind.Add(1)
	}
	r.ctx, r.cancel = context.WithCancel(s.ctx)
	if !snapshot && s.attach(r) {
		return r, nil
	}
	if r.catchTo != 0 {
		return r, nil // Next catches up, then creates the consumer
	}
	if err := r.follow(ctx); err != nil {
		r.cancel()
		return nil, err
	}
	return r, nil
}

// awaitRun returns the run's metadata; with wait, an unknown run is looked up again for up
// to JoinWait.
func (s *Store) awaitRun(ctx context.Context, principal, runID string, wait bool) (RunInfo, error) {
	info, err := s.lookup(ctx, principal, runID)
	if !wait || !errors.Is(err, ErrUnknownRun) {
		return info, err
	}
	deadline := time.Now().Add(s.cfg.JoinWait)
	for errors.Is(err, ErrUnknownRun) && time.Now().Before(deadline) {
		if err := s.sleep(ctx, 50*time.Millisecond); err != nil {
			return RunInfo{}, err
		}
		info, err = s.lookup(ctx, principal, runID)
	}
	return info, err
}

// lastOfGeneration returns the run's metadata and the last message of its generation on
// subject (nil when the generation holds none yet): ErrInvalidOffset when a resubmit keeps
// writing past the metadata read, ErrUnknownRun for a closed run whose log aged out.
func (s *Store) lastOfGeneration(ctx context.Context, principal, runID string, st natsjs.Stream, subject string, info RunInfo) (RunInfo, *natsjs.RawStreamMsg, error) {
	var last *natsjs.RawStreamMsg
	var err error
	for attempt := 0; ; attempt++ {
		if last, err = lastMsg(ctx, st, subject); err != nil {
			return info, nil, err
		}
		if last == nil || msgGen(last.Header) <= info.Generation || attempt == 3 {
			break
		}
		// A resubmit wrote after our metadata read: read the metadata again.
		if info, err = s.lookup(ctx, principal, runID); err != nil {
			return info, nil, err
		}
	}
	switch {
	case last != nil && msgGen(last.Header) > info.Generation:
		return info, nil, ErrInvalidOffset
	case last != nil && msgGen(last.Header) < info.Generation:
		last = nil // a resubmit is between its metadata update and its purge
	case last == nil && info.State == RunClosed:
		return info, nil, ErrUnknownRun // aged out
	}
	return info, last, nil
}

// startAtTail makes a FromNow reader start after last, the log's last message (nil: none):
// at the end already when last is the close record. It resolves r.after to the last
// event's offset, or FromStart when the log holds none.
func (r *Reader) startAtTail(last *natsjs.RawStreamMsg) {
	r.next, r.after = 1, FromStart
	if last == nil {
		return
	}
	if last.Header.Get(hdrCtl) == ctlClose {
		r.eof = true
		r.closedAfter, _ = strconv.ParseUint(last.Header.Get(hdrAfter), 10, 64)
		return
	}
	r.next = last.Sequence + 1
	if last.Header.Get(hdrCtl) == ctlTakeover && len(last.Data) > 0 {
		r.after = string(last.Data)
	}
	if last.Header.Get(hdrCtl) == "" {
		if events, err := decodeBatch(last.Data); err == nil && len(events) > 0 {
			r.after = position{gen: r.gen, seq: last.Sequence, idx: len(events) - 1, tag: r.tag}.String()
		}
	}
}

// startAfter makes r start strictly after the minted offset pos: the rest of pos's batch is
// queued, and the consumer starts at the next message. An offset of another run or
// generation, of no stored event, or past the end is ErrInvalidOffset.
func (r *Reader) startAfter(ctx context.Context, pos position) error {
	if pos.tag != r.tag || pos.gen != r.gen {
		return ErrInvalidOffset
	}
	m, err := r.st.GetMsg(ctx, pos.seq)
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return ErrInvalidOffset
	}
	if err != nil {
		return err
	}
	if m.Subject != r.subject || m.Header.Get(hdrCtl) != "" || msgGen(m.Header) != pos.gen {
		return ErrInvalidOffset
	}
	events, err := decodeBatch(m.Data)
	if err != nil || pos.idx >= len(events) {
		return ErrInvalidOffset
	}
	r.queue(m.Sequence, events[pos.idx+1:], pos.idx+1)
	r.next = m.Sequence + 1
	if r.stopAt != 0 && m.Sequence >= r.stopAt {
		r.eof = true
	}
	return nil
}

// readerInactiveThreshold is how long the server keeps a reader's consumer once nobody pulls
// from it: Reader.Close deletes it at once, this bounds what a crashed process leaves, and
// what a Reader leaves when it replaces a failed consumer. A stream has a bounded number of
// consumers (nats-server's default: 1000), so they must not outlive their readers by much.
const readerInactiveThreshold = 15 * time.Second

// readerIdle is how long a Reader waits for its consumer before it checks the log for
// messages the consumer missed.
const readerIdle = 5 * time.Second

// The pull requests of a Reader's consumer: they expire after readerIdle, and an idle one
// carries a heartbeat every quarter of it, so that two missed heartbeats, after which nats.go
// reports a dead consumer, fit in half of the silence bound (nats.go wants an expiry of at
// least 1s and a heartbeat from 500ms to 30s, at most half the expiry).
const (
	readerPullExpiry    = natsjs.PullExpiry(readerIdle)
	readerPullHeartbeat = natsjs.PullHeartbeat(readerIdle / 4)
)

// Backoff between attempts to create a Reader's consumer.
const (
	followBackoff    = 100 * time.Millisecond
	followBackoffMax = 2 * time.Second
)

// follow creates the reader's consumer, delivering from r.next, retrying with backoff what
// may be transient until it succeeds, ctx ends or the reader is closed.
func (r *Reader) follow(ctx context.Context) error {
	ctx, cancel := r.bound(ctx)
	defer cancel()
	for backoff := followBackoff; ; backoff = min(2*backoff, followBackoffMax) {
		err := r.subscribe(ctx)
		switch {
		case err == nil:
			return nil
		case r.ctx.Err() != nil:
			return ErrClosed
		case ctx.Err() != nil:
			return ctx.Err()
		case !retryable(err):
			return err
		}
		r.s.log.Debug("jetstream: creating a reader's consumer, retrying", keyErr, err)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

// subscribe makes one attempt at creating the reader's consumer, under a new name. At most
// maxCreates creations of a store are in flight: when many readers start at once (every
// client of a dead gateway resuming), the others wait here, not in the server's API queue,
// where they would time out and be retried while the first attempts still create consumers.
func (r *Reader) subscribe(ctx context.Context) error {
	select {
	case r.s.creates <- struct{}{}:
		defer func() { <-r.s.creates }()
	case <-ctx.Done():
		return ctx.Err()
	}
	ctx, cancel := context.WithTimeout(ctx, r.s.cfg.PublishTimeout)
	defer cancel()
	name := "wsgr_" + randomHex(8)
	cons, err := r.s.createConsumer(ctx, r.st, natsjs.ConsumerConfig{
		Name:              name,
		DeliverPolicy:     natsjs.DeliverByStartSequencePolicy,
		OptStartSeq:       r.next,
		AckPolicy:         natsjs.AckNonePolicy,
		FilterSubject:     r.subject,
		InactiveThreshold: readerInactiveThreshold,
		Replicas:          1,
		MemoryStorage:     true,
	})
	if err != nil {
		return err
	}
	it, err := cons.Messages(readerPullExpiry, readerPullHeartbeat)
	if err != nil {
		r.deleteConsumer(name)
		return err
	}
	r.mu.Lock()
	closed := r.closed
	if !closed {
		r.it, r.cons, r.dseq = it, name, 0
	}
	r.mu.Unlock()
	if closed {
		it.Stop()
		r.deleteConsumer(name)
		return ErrClosed
	}
	return nil
}

// bound returns ctx, also canceled when the reader is closed.
func (r *Reader) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(r.ctx, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// msgGen returns the run generation a message belongs to.
func msgGen(h nats.Header) uint64 {
	g, _ := strconv.ParseUint(h.Get(hdrGen), 10, 64)
	return g
}

// queue adds the events of message seq, the first of which is at index first. Their offsets
// share one string, so a message's events cost one allocation for all their offsets.
func (r *Reader) queue(seq uint64, events [][]byte, first int) {
	var b strings.Builder
	b.Grow(len(events) * offsetLen)
	var buf [offsetLen]byte
	ends := make([]int, len(events))
	for i := range events {
		b.Write(position{gen: r.gen, seq: seq, idx: first + i, tag: r.tag}.append(buf[:0]))
		ends[i] = b.Len()
	}
	offs := b.String()
	r.pending = slices.Grow(r.pending, len(events))
	start := 0
	for i, e := range events {
		r.pending = append(r.pending, Entry{Offset: offs[start:ends[i]], Event: e})
		start = ends[i]
	}
}

// TraceContext returns the span context of the run's turn, as its metadata recorded it when
// the log was created; invalid when the turn was not traced.
func (r *Reader) TraceContext() trace.SpanContext { return r.traced }

// After returns the offset the reader reads strictly after: the one Read was given, or for
// FromNow the offset of the last event stored when it opened (FromStart when there was none).
// A reader that failed before it returned anything is reopened after it, without a gap.
func (r *Reader) After() string { return r.after }

// Next returns the next stored entry, blocking while the log is open and idle. It returns
// io.EOF once the log is closed and every entry before the close was returned, and
// ErrInvalidOffset when the run was resubmitted under the reader.
func (r *Reader) Next(ctx context.Context) (Entry, error) {
	for len(r.pending) == 0 {
		if r.eof {
			return Entry{}, io.EOF
		}
		msg, seq, err := r.receive(ctx)
		if err != nil {
			return Entry{}, fmt.Errorf("next: %w", err)
		}
		if seq >= r.behindTo {
			r.caughtUp()
		}
		r.next = seq + 1
		h := msg.Headers()
		switch g := msgGen(h); {
		case g < r.gen:
			continue // left by the previous generation, about to be purged
		case g > r.gen:
			return Entry{}, fmt.Errorf("next: run resubmitted: %w", ErrInvalidOffset)
		}
		switch h.Get(hdrCtl) {
		case ctlClose:
			r.eof, r.sawClose = true, true
			r.closedAfter, _ = strconv.ParseUint(h.Get(hdrAfter), 10, 64)
			r.stop()
			continue
		case ctlOpen, ctlTakeover:
			if r.stopAt != 0 && seq >= r.stopAt {
				r.eof = true
				r.stop()
			}
			continue
		}
		events, err := decodeBatch(msg.Data())
		if err != nil {
			return Entry{}, fmt.Errorf("next: %w", err)
		}
		r.queue(seq, events, 0)
		if r.stopAt != 0 && seq >= r.stopAt {
			r.eof = true
			r.stop()
		}
	}
	e := r.pending[0]
	r.pending = r.pending[1:]
	return e, nil
}

// receive returns the log's message at r.next and its sequence. It replaces the consumer when
// it fails (see Reader) and returns only when ctx ends or the reader is closed.
func (r *Reader) receive(ctx context.Context) (natsjs.Msg, uint64, error) {
	for {
		r.mu.Lock()
		it, sub, closed := r.it, r.sub, r.closed
		r.mu.Unlock()
		if closed || r.ctx.Err() != nil {
			return nil, 0, ErrClosed
		}
		if len(r.backlog) > 0 {
			m := r.backlog[0]
			r.backlog[0] = tailMsg{}
			r.backlog = r.backlog[1:]
			return m.msg, m.seq, nil
		}
		if sub != nil {
			bctx, cancel := r.bound(ctx)
			m, ok, err := sub.next(bctx)
			cancel()
			switch {
			case ok:
				return m.msg, m.seq, nil
			case err != nil && ctx.Err() != nil:
				return nil, 0, ctx.Err()
			case err != nil:
				return nil, 0, ErrClosed
			}
			// Detached, or the tail ended: go on with a consumer of its own.
			r.mu.Lock()
			r.sub = nil
			r.mu.Unlock()
			continue
		}
		if it != nil && r.stopAt == 0 && !r.source && r.s.tailCovers(r) {
			r.release() // caught up with the log's shared tail: leave the own consumer
			if r.s.attach(r) {
				continue
			}
			it = nil
		}
		if it == nil && r.catchTo >= r.next {
			to := r.catchTo
			r.catchTo = 0
			bctx, cancel := r.bound(ctx)
			msgs, err := r.s.catchUp(bctx, r.st, r.subject, r.next, to)
			cancel()
			switch {
			case err == nil:
				r.backlog, r.next = msgs, to+1
				if r.stopAt != 0 && to >= r.stopAt {
					continue // the pass read all there is to read
				}
				// The tail or a consumer takes over after the pass's end before the reader
				// returns a message: one closed meanwhile releases it.
				if r.stopAt == 0 && !r.source && r.s.tailCovers(r) && r.s.attach(r) {
					continue
				}
				if err := r.follow(ctx); err != nil {
					return nil, 0, err
				}
				continue
			case ctx.Err() != nil:
				return nil, 0, ctx.Err()
			case r.ctx.Err() != nil:
				return nil, 0, ErrClosed
			}
			if !errors.Is(err, errNoPass) {
				r.s.log.Debug("jetstream: a reader's catch-up failed, reading with its own consumer", keyErr, err)
			}
		}
		if it == nil {
			if err := r.follow(ctx); err != nil {
				return nil, 0, err
			}
			continue
		}
		wait, cancel := context.WithTimeout(ctx, readerIdle)
		msg, err := it.Next(natsjs.NextContext(wait))
		cancel()
		switch {
		case err == nil:
			md, err := msg.Metadata()
			if err != nil {
				return nil, 0, err
			}
			if md.Sequence.Consumer == r.dseq+1 && md.Sequence.Stream >= r.next {
				r.dseq = md.Sequence.Consumer
				return msg, md.Sequence.Stream, nil
			}
			r.s.log.Debug("jetstream: a reader's consumer skipped a message, replacing it")
		case ctx.Err() != nil:
			return nil, 0, ctx.Err()
		case r.ctx.Err() != nil:
			return nil, 0, ErrClosed
		case errors.Is(err, context.DeadlineExceeded):
			if !r.missed(ctx) {
				continue
			}
			r.s.log.Debug("jetstream: a reader's consumer is stuck, replacing it")
		default:
			// Missed heartbeats (its server is gone), the consumer deleted, the iterator
			// ended with the connection.
			r.s.log.Debug("jetstream: a reader's consumer failed, replacing it", keyErr, err)
		}
		r.drop()
	}
}

// missed says whether the log holds a message the reader has not received: its consumer is
// stuck. When the stream does not answer, the consumer stays: nothing new is stored then, and
// a consumer whose server died is reported by its missing heartbeats.
func (r *Reader) missed(ctx context.Context) bool {
	ctx, cancel := r.bound(ctx)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, r.s.cfg.PublishTimeout)
	defer cancelT()
	last, err := lastMsg(ctx, r.st, r.subject)
	return err == nil && last != nil && last.Sequence >= r.next
}

// drop stops the reader's consumer, which the next receive replaces. The server deletes it
// after readerInactiveThreshold: deleting it here could take as long as the stream is
// unavailable, which is when consumers fail.
func (r *Reader) drop() {
	r.mu.Lock()
	it := r.it
	r.it, r.cons = nil, ""
	r.mu.Unlock()
	if it != nil {
		it.Stop()
	}
}

// stop stops the reader's consumer and deletes it, so that a stream's consumer count follows
// its open readers, or leaves the shared tail.
func (r *Reader) stop() {
	if r.cancel != nil { // nil when the log was at its end when opened
		r.cancel()
	}
	r.release()
}

// release deletes the reader's own consumer, or leaves its shared tail.
func (r *Reader) release() {
	r.mu.Lock()
	it, name, sub := r.it, r.cons, r.sub
	r.it, r.cons, r.sub = nil, "", nil
	r.mu.Unlock()
	if sub != nil {
		sub.t.leave(sub)
	}
	if it == nil {
		return
	}
	it.Stop()
	r.deleteConsumer(name)
}

// deleteConsumer deletes the consumer name, within PublishTimeout.
func (r *Reader) deleteConsumer(name string) { r.s.deleteConsumer(r.st, name) }

// createConsumer creates a consumer on st. A request that got no answer (its context ended,
// or the connection failed) may still make the consumer, which nobody would pull from until
// its inactive threshold: it is deleted (deleteLater).
func (s *Store) createConsumer(ctx context.Context, st natsjs.Stream, cfg natsjs.ConsumerConfig) (natsjs.Consumer, error) {
	cons, err := st.CreateConsumer(ctx, cfg)
	var apiErr *natsjs.APIError
	if err != nil && !errors.As(err, &apiErr) {
		s.deleteLater(st, cfg.Name)
	}
	return cons, err
}

// deleteLater deletes, in the background, the consumer name of st whose creation got no
// answer, or whose delete failed (a timeout on a busy cluster). A delete may find none while
// the creation is still on its way (in a cluster, through the meta leader's log) and made
// after: deletes are tried, further and further apart, until one deletes it, or the store
// closes, or for twice unansweredWatch. A store closed already deletes nothing more: its
// Close may be waiting for its goroutines, and the server drops the consumer anyway.
func (s *Store) deleteLater(st natsjs.Stream, name string) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		for wait := 100 * time.Millisecond; ; wait *= 2 {
			ctx, cancel := context.WithTimeout(s.ctx, s.cfg.PublishTimeout)
			err := st.DeleteConsumer(ctx, name)
			cancel()
			if err == nil || wait > unansweredWatch || s.sleep(s.ctx, wait) != nil {
				return
			}
		}
	}()
}

// unansweredWatch is half of how long deleteLater watches for a consumer whose creation
// got no answer: well within readerInactiveThreshold, after which the server drops it anyway.
const unansweredWatch = 3200 * time.Millisecond

// deleteConsumer deletes the consumer name of st, if it is there; a delete that fails is
// tried again in the background (deleteLater).
func (s *Store) deleteConsumer(st natsjs.Stream, name string) {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.PublishTimeout)
	defer cancel()
	if err := st.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, natsjs.ErrConsumerNotFound) && s.ctx.Err() == nil {
		s.log.Debug("jetstream: deleting a consumer, trying again", "consumer", name, keyErr, err)
		s.deleteLater(st, name)
	}
}

// Close releases the reader's consumer and makes a blocked Next return, at once even while
// the consumer is being replaced. It is idempotent and safe to call from another goroutine.
func (r *Reader) Close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.caughtUp()
	r.stop()
	return nil
}

// caughtUp takes the reader out of the store's readers behind their log's end.
func (r *Reader) caughtUp() {
	if r.counted.CompareAndSwap(true, false) {
		r.s.behind.Add(-1)
	}
}

// LastEvent waits until the run's log is closed and returns its last event (nil when it holds
// none) without reading the log through: a Reader from its tail (FromNow) reads what is
// stored until the close, and when that is no event, one direct get reads the batch the close
// record names (hdrAfter), which ends with the terminal. A run with no log yet is waited for up
// to JoinWait, as by a FromStart Read; a log closed by a gateway whose close records name no
// batch is read from its start. Errors as Read's.
func (s *Store) LastEvent(ctx context.Context, principal, runID string) ([]byte, error) {
	if _, err := s.awaitRun(ctx, principal, runID, true); err != nil {
		return nil, fmt.Errorf("last event: %w", err)
	}
	r, err := s.open(ctx, principal, runID, FromNow, false)
	if err != nil {
		return nil, fmt.Errorf("last event: %w", err)
	}
	last, err := r.last(ctx)
	if err == nil && last == nil && r.closedAfter != 0 {
		last, err = r.lastOfBatch(ctx, r.closedAfter)
	}
	legacy := err == nil && last == nil && r.closedAfter == 0
	r.Close()
	if legacy {
		if r, err = s.open(ctx, principal, runID, FromStart, false); err == nil {
			last, err = r.last(ctx)
			r.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("last event: %w", err)
	}
	return last, nil
}

// last reads r to the log's close and returns the last event it read, nil if none.
func (r *Reader) last(ctx context.Context) ([]byte, error) {
	var last []byte
	for {
		e, err := r.Next(ctx)
		if errors.Is(err, io.EOF) {
			return last, nil
		}
		if err != nil {
			return nil, err
		}
		last = e.Event
	}
}

// lastOfBatch returns the last event of the log's message at seq: nil for the open record, or
// a message gone (aged out).
func (r *Reader) lastOfBatch(ctx context.Context, seq uint64) ([]byte, error) {
	m, err := r.st.GetMsg(ctx, seq)
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if m.Subject != r.subject || msgGen(m.Header) != r.gen || m.Header.Get(hdrCtl) != "" {
		return nil, nil
	}
	events, err := decodeBatch(m.Data)
	if err != nil || len(events) == 0 {
		return nil, err
	}
	return events[len(events)-1], nil
}

// Snapshot returns what the run's log holds now, without waiting; closed says whether the
// log is closed.
func (s *Store) Snapshot(ctx context.Context, principal, runID string) (entries []Entry, closed bool, err error) {
	r, err := s.open(ctx, principal, runID, FromStart, true)
	if err != nil {
		return nil, false, fmt.Errorf("snapshot: %w", err)
	}
	defer r.Close()
	for {
		e, err := r.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, false, fmt.Errorf("snapshot: %w", err)
		}
		entries = append(entries, e)
	}
	return entries, r.sawClose, nil
}
