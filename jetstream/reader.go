package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	nats "github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
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
type Reader struct {
	s       *Store
	subject string
	tag     string
	gen     uint64
	cons    natsjs.Consumer
	it      natsjs.MessagesContext
	pending []Entry
	eof     bool
	stopAt  uint64 // when non-zero: EOF after the message of this sequence (Snapshot)
	// sawClose says the close record was read.
	sawClose bool
	closed   atomic.Bool
	stopOnce sync.Once
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

// lastMsg returns the last message of subject, or nil when it has none.
func (s *Store) lastMsg(ctx context.Context, subject string) (*natsjs.RawStreamMsg, error) {
	m, err := s.stream.GetLastMsgForSubject(ctx, subject)
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
	info, err := s.lookup(ctx, principal, runID)
	// A join may precede the run's creation; a resume from an offset of this stream may be
	// served by a bucket replica that has not applied the run's metadata yet (KV gets are
	// direct gets): both wait up to JoinWait for the run to appear.
	if errors.Is(err, ErrUnknownRun) && ((after == FromStart && !snapshot) || (after != FromNow && pos.tag == offsetTag(s.epoch, logKey(principal, runID)))) {
		deadline := time.Now().Add(s.cfg.JoinWait)
		for errors.Is(err, ErrUnknownRun) && time.Now().Before(deadline) {
			if err := s.sleep(ctx, 50*time.Millisecond); err != nil {
				return nil, err
			}
			info, err = s.lookup(ctx, principal, runID)
		}
	}
	if err != nil {
		return nil, err
	}
	subject, tag := s.subject(principal, runID)
	var last *natsjs.RawStreamMsg
	for attempt := 0; ; attempt++ {
		if last, err = s.lastMsg(ctx, subject); err != nil {
			return nil, err
		}
		if last == nil || msgGen(last.Header) <= info.Generation || attempt == 3 {
			break
		}
		// A resubmit wrote after our metadata read: read the metadata again.
		if info, err = s.lookup(ctx, principal, runID); err != nil {
			return nil, err
		}
	}
	switch {
	case last != nil && msgGen(last.Header) > info.Generation:
		return nil, ErrInvalidOffset
	case last != nil && msgGen(last.Header) < info.Generation:
		last = nil // a resubmit is between its metadata update and its purge
	case last == nil && info.State == RunClosed:
		return nil, ErrUnknownRun // aged out
	}
	r := &Reader{s: s, subject: subject, tag: tag, gen: info.Generation}
	if snapshot {
		if last == nil {
			r.eof = true
			return r, nil
		}
		r.stopAt = last.Sequence
	}
	var start uint64 = 1
	switch after {
	case FromStart:
	case FromNow:
		if last != nil {
			if last.Header.Get(hdrCtl) == ctlClose {
				r.eof = true
				return r, nil
			}
			start = last.Sequence + 1
		}
	default:
		if pos.tag != tag || pos.gen != info.Generation {
			return nil, ErrInvalidOffset
		}
		m, err := s.stream.GetMsg(ctx, pos.seq)
		if errors.Is(err, natsjs.ErrMsgNotFound) {
			return nil, ErrInvalidOffset
		}
		if err != nil {
			return nil, err
		}
		if m.Subject != subject || m.Header.Get(hdrCtl) != "" || msgGen(m.Header) != pos.gen {
			return nil, ErrInvalidOffset
		}
		events, err := decodeBatch(m.Data)
		if err != nil || pos.idx >= len(events) {
			return nil, ErrInvalidOffset
		}
		r.queue(m.Sequence, events[pos.idx+1:], pos.idx+1)
		start = m.Sequence + 1
		if r.stopAt != 0 && m.Sequence >= r.stopAt {
			r.eof = true
			return r, nil
		}
	}
	cfg := natsjs.OrderedConsumerConfig{FilterSubjects: []string{subject}, InactiveThreshold: readerInactiveThreshold}
	if start > 1 {
		cfg.DeliverPolicy, cfg.OptStartSeq = natsjs.DeliverByStartSequencePolicy, start
	}
	if r.cons, err = s.stream.OrderedConsumer(ctx, cfg); err != nil {
		return nil, err
	}
	if r.it, err = r.cons.Messages(); err != nil {
		return nil, err
	}
	return r, nil
}

// readerInactiveThreshold is how long the server keeps a reader's consumer once nobody pulls
// from it: Reader.Close deletes it at once, this bounds what a crashed process leaves. A
// stream has a bounded number of consumers (nats-server's default: 1000), so they must not
// outlive their readers by much.
const readerInactiveThreshold = 15 * time.Second

// msgGen returns the run generation a message belongs to.
func msgGen(h nats.Header) uint64 {
	g, _ := strconv.ParseUint(h.Get(hdrGen), 10, 64)
	return g
}

// queue adds the events of message seq, the first of which is at index first.
func (r *Reader) queue(seq uint64, events [][]byte, first int) {
	for i, e := range events {
		r.pending = append(r.pending, Entry{
			Offset: position{gen: r.gen, seq: seq, idx: first + i, tag: r.tag}.String(),
			Event:  e,
		})
	}
}

// Next returns the next stored entry, blocking while the log is open and idle. It returns
// io.EOF once the log is closed and every entry before the close was returned, and
// ErrInvalidOffset when the run was resubmitted under the reader.
func (r *Reader) Next(ctx context.Context) (Entry, error) {
	for len(r.pending) == 0 {
		if r.eof {
			return Entry{}, io.EOF
		}
		if r.closed.Load() || r.it == nil {
			return Entry{}, fmt.Errorf("next: %w", ErrClosed)
		}
		msg, err := r.it.Next(natsjs.NextContext(ctx))
		if err != nil {
			if errors.Is(err, natsjs.ErrMsgIteratorClosed) {
				err = ErrClosed
			}
			return Entry{}, fmt.Errorf("next: %w", err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return Entry{}, fmt.Errorf("next: %w", err)
		}
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
			r.stop()
			continue
		case ctlOpen:
			if r.stopAt != 0 && md.Sequence.Stream >= r.stopAt {
				r.eof = true
				r.stop()
			}
			continue
		}
		events, err := decodeBatch(msg.Data())
		if err != nil {
			return Entry{}, fmt.Errorf("next: %w", err)
		}
		r.queue(md.Sequence.Stream, events, 0)
		if r.stopAt != 0 && md.Sequence.Stream >= r.stopAt {
			r.eof = true
			r.stop()
		}
	}
	e := r.pending[0]
	r.pending = r.pending[1:]
	return e, nil
}

// stop stops the iterator and deletes the consumer (once), so that a stream's consumer count
// follows its open readers.
func (r *Reader) stop() {
	r.stopOnce.Do(func() {
		if r.it == nil {
			return
		}
		r.it.Stop()
		info := r.cons.CachedInfo()
		if info == nil {
			return
		}
		ctx, cancel := context.WithTimeout(r.s.ctx, r.s.cfg.PublishTimeout)
		defer cancel()
		if err := r.s.stream.DeleteConsumer(ctx, info.Name); err != nil && !errors.Is(err, natsjs.ErrConsumerNotFound) && ctx.Err() == nil {
			r.s.log.Debug("jetstream: deleting a reader's consumer", keyErr, err)
		}
	})
}

// Close releases the reader's consumer and makes a blocked Next return. It is idempotent and
// safe to call from another goroutine.
func (r *Reader) Close() error {
	r.closed.Store(true)
	r.stop()
	return nil
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
