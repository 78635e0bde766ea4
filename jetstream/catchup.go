package jetstream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
)

// Catch-ups: a reader that starts behind its log's end (a resume, a join from the start, a
// snapshot) reads the stored part, up to the log's last message when it opened, in a pass
// shared with the other readers of the same stream that start meanwhile: one unfiltered
// consumer reads the stream from the first message any of them needs to the last, and the
// store hands each reader the messages of its log. A consumer filtered to one subject costs
// the server a walk over every message of the other runs between two of its own, under the
// stream store's lock (and one filtered to many subjects, a walk over the subjects of a
// message block per message): when a gateway dies, all the clients of its runs resume at
// once, and a thousand such walks starve the stream's writes, the live runs' and the
// reaper's. An unfiltered consumer costs one step per message. After the pass a reader
// follows the log with a consumer of its own, or the shared tail, from the message after
// the pass's end; a reader whose pass failed does so from where it was.

// A pass is worth its reading of every message of the stream in its range only when it serves
// many readers at once (a consumer of a reader's own walks the same range on the server, at a
// fraction of the cost per message), and only over a recent range: a reader that starts while
// fewer than minCatchUpReaders of the store's readers are behind their log's end, one further
// behind than maxCatchUpSpan, or one that starts with fewer than minCatchUpReaders others
// within catchUpGather, reads with a consumer of its own.
const (
	minCatchUpReaders = 8
	catchUpGather     = 20 * time.Millisecond
	maxCatchUpSpan    = 1 << 18 // stream messages
)

// errNoPass: the reader reads with a consumer of its own.
var errNoPass = errors.New("catch-up: no shared pass")

// catchUpReq is one reader's part of a pass: the messages of subject from sequence from to
// sequence to.
type catchUpReq struct {
	subject  string
	from, to uint64
	// The pass owns these until it closes done.
	msgs []tailMsg
	err  error
	done chan struct{}
	over bool // done is closed
}

// catchUps are the waiting readers of one stream, and whether a pass runs.
type catchUps struct {
	st      natsjs.Stream
	pending []*catchUpReq
	running bool
}

// catchUp returns the messages of subject on st from sequence from to sequence to, read in
// a pass shared with the other readers that catch up on st meanwhile.
func (s *Store) catchUp(ctx context.Context, st natsjs.Stream, subject string, from, to uint64) ([]tailMsg, error) {
	if s.behind.Load() < minCatchUpReaders {
		return nil, errNoPass
	}
	// The first message of the log from `from` on: the server finds it from its index of
	// subjects, and the pass need not read the stream before it.
	gctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
	m, err := st.GetMsg(gctx, from, natsjs.WithGetMsgSubject(subject))
	cancel()
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return nil, nil // nothing stored from `from` on any more (aged out)
	}
	if err != nil {
		return nil, err
	}
	if m.Sequence > to {
		return nil, nil
	}
	if to-m.Sequence > maxCatchUpSpan {
		return nil, errNoPass
	}
	req := &catchUpReq{subject: subject, from: m.Sequence, to: to, done: make(chan struct{})}
	name := st.CachedInfo().Config.Name
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	c := s.catchUps[name]
	if c == nil {
		c = &catchUps{st: st}
		s.catchUps[name] = c
	}
	c.pending = append(c.pending, req)
	if !c.running {
		c.running = true
		s.wg.Add(1)
		go s.runCatchUps(c)
	}
	s.mu.Unlock()
	select {
	case <-req.done:
		return req.msgs, req.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// runCatchUps runs passes for the waiting readers of c's stream until none is left: the
// readers that come within catchUpGather of the first, or during a pass, are served together
// by the next.
func (s *Store) runCatchUps(c *catchUps) {
	defer s.wg.Done()
	s.sleep(s.ctx, catchUpGather)
	for {
		s.mu.Lock()
		batch := c.pending
		c.pending = nil
		if len(batch) == 0 {
			c.running = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		err := errNoPass
		if len(batch) >= minCatchUpReaders {
			err = s.catchUpPass(c.st, batch)
		}
		for _, r := range batch {
			if !r.over {
				r.msgs, r.err = nil, err
				close(r.done)
			}
		}
	}
}

// catchUpPass reads the stream from the lowest sequence a reader of batch wants to the
// highest, handing each reader the messages of its subject in its range, each reader as
// soon as the pass is past its range. It returns why it stopped before the end.
func (s *Store) catchUpPass(st natsjs.Stream, batch []*catchUpReq) error {
	bySubject := map[string][]*catchUpReq{}
	for _, r := range batch {
		bySubject[r.subject] = append(bySubject[r.subject], r)
	}
	byEnd := slices.Clone(batch)
	slices.SortFunc(byEnd, func(a, b *catchUpReq) int { return cmp.Compare(a.to, b.to) })
	lo := slices.MinFunc(batch, func(a, b *catchUpReq) int { return cmp.Compare(a.from, b.from) }).from
	select {
	case s.creates <- struct{}{}:
	case <-s.ctx.Done():
		return ErrClosed
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.PublishTimeout)
	name := "wsgc_" + randomHex(8)
	cons, err := s.createConsumer(ctx, st, natsjs.ConsumerConfig{
		Name:              name,
		DeliverPolicy:     natsjs.DeliverByStartSequencePolicy,
		OptStartSeq:       lo,
		AckPolicy:         natsjs.AckNonePolicy,
		InactiveThreshold: readerInactiveThreshold,
		Replicas:          1,
		MemoryStorage:     true,
	})
	cancel()
	<-s.creates
	if err != nil {
		return fmt.Errorf("catch-up: %w", err)
	}
	defer s.deleteConsumer(st, name)
	it, err := cons.Messages(readerPullExpiry, readerPullHeartbeat)
	if err != nil {
		return fmt.Errorf("catch-up: %w", err)
	}
	defer it.Stop()
	var dseq uint64
	for len(byEnd) > 0 {
		wait, cancel := context.WithTimeout(s.ctx, readerIdle)
		msg, err := it.Next(natsjs.NextContext(wait))
		cancel()
		if err != nil {
			return fmt.Errorf("catch-up: %w", err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("catch-up: %w", err)
		}
		if md.Sequence.Consumer != dseq+1 {
			return errors.New("catch-up: the consumer skipped a message")
		}
		dseq = md.Sequence.Consumer
		seq := md.Sequence.Stream
		for _, r := range bySubject[msg.Subject()] {
			if seq >= r.from && seq <= r.to {
				r.msgs = append(r.msgs, tailMsg{msg: msg, seq: seq})
			}
		}
		for len(byEnd) > 0 && (byEnd[0].to <= seq || md.NumPending == 0) {
			byEnd[0].over = true
			close(byEnd[0].done)
			byEnd = byEnd[1:]
		}
	}
	return nil
}
