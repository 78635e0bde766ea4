package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/wsgateway/wsgateway/jetstream/lease"
	"github.com/wsgateway/wsgateway/protocol"
)

// ProducerLost is the terminal the reaper stores in the log of a run whose producer is gone.
var ProducerLost = []byte(`{"type":"RUN_ERROR","message":"producer lost","code":"producer_lost"}`)

// leaseChanged (lease.Config.Changed) fails this store's writer of key when its lease changed hands after the
// writer took it (revision rev, l nil for a deletion): with ErrFenced when a resubmit took
// the run for a newer generation, with ErrLeaseLost otherwise (a reaper claimed it).
func (s *Store) leaseChanged(key string, rev uint64, l *lease.Value) {
	s.mu.Lock()
	w := s.byKey[key]
	s.mu.Unlock()
	if w == nil {
		return
	}
	w.mu.Lock()
	stale := rev <= w.leaseRev || w.closing
	w.mu.Unlock()
	switch {
	case stale || (l != nil && l.Owner == s.cfg.Owner && l.Gen == w.info.Generation):
	case l != nil && l.Gen > w.info.Generation:
		w.fail(ErrFenced)
	default:
		w.fail(ErrLeaseLost)
	}
}

// reapRun is the run of key whose expired lease this store's keeper claimed at revision
// leaseRev (lease.Config.Claimed): it takes the run over (takeOver) or appends the
// producer_lost terminal and the close record to the run's log, fenced by the subject's last
// sequence so that the dead producer's later appends fail. A log whose last event is a
// terminal (RUN_FINISHED or RUN_ERROR: the producer stopped between its terminal and its
// close record) gets the close record alone.
func (s *Store) reapRun(ctx context.Context, key string, leaseRev uint64) error {
	var a *acks
	defer func() { a.release() }()
	for attempt := 0; attempt < 5; attempt++ {
		e, err := s.meta.Get(ctx, key)
		if errors.Is(err, natsjs.ErrKeyNotFound) {
			return s.leases.Drop(ctx, key, leaseRev)
		}
		if err != nil {
			return err
		}
		var info RunInfo
		if err := json.Unmarshal(e.Value(), &info); err != nil {
			return err
		}
		if info.State != RunOpen {
			return s.leases.Drop(ctx, key, leaseRev)
		}
		sh, err := s.shard(ctx, info.Stream)
		if err != nil {
			return err
		}
		subject, _ := sh.subject(info.Principal, info.RunID)
		var last uint64
		terminal := false
		m, err := lastMsg(ctx, sh.stream, subject)
		if err != nil {
			return err
		}
		if m != nil {
			if msgGen(m.Header) != info.Generation {
				return nil // a resubmit is under way; its writer holds a fresh lease
			}
			if m.Header.Get(hdrCtl) == ctlClose {
				info.State, info.Closed = RunClosed, time.Now().UTC()
				if err := s.closeRun(ctx, key, info, e.Revision(), leaseRev); err != nil {
					return err
				}
				s.closedLater(info)
				return nil
			}
			last = m.Sequence
			if endsWithTerminal(m) {
				// The producer stored its terminal and stopped before its close record:
				// the log only needs closing, and a second terminal would contradict
				// the first.
				terminal = true
			}
		}
		// A resubmit takes the lease before it changes anything else: if our claim still
		// stands, the log read above is the generation to close.
		if !s.leases.Held(ctx, key, leaseRev) {
			return nil
		}
		if !terminal {
			if taken, err := s.takeOver(ctx, key, e, info, sh, m, leaseRev); taken || err != nil {
				return err
			}
		}
		id := fmt.Sprintf("reap.%s.%d.%d", key, info.Generation, last)
		if a == nil {
			if a, err = s.newAcks(); err != nil {
				return err
			}
		}
		seq := last
		if !terminal {
			seq, err = s.publishAfter(ctx, a, sh.stream, subject, info.Generation, last, id, encodeBatch(nil, [][]byte{ProducerLost}), "")
			if errors.Is(err, ErrFenced) {
				continue
			}
			if err != nil {
				return err
			}
		}
		if _, err := s.publishAfter(ctx, a, sh.stream, subject, info.Generation, seq, id+".close", nil, ctlClose); errors.Is(err, ErrFenced) {
			continue
		} else if err != nil {
			return err
		}
		info.State, info.Closed, info.Reaped = RunClosed, time.Now().UTC(), true
		if err := s.closeRun(ctx, key, info, e.Revision(), leaseRev); err != nil {
			return err
		}
		if f := s.cfg.Metrics.RunReaped; f != nil {
			f()
		}
		// The producer died before it finished the run's thread: its log says how it ended.
		s.closedLater(info)
		return nil
	}
	return errors.New("log keeps moving")
}

// endsWithTerminal reports whether the batch message m ends with a terminal event
// (RUN_FINISHED or RUN_ERROR). Control records and undecodable batches do not.
func endsWithTerminal(m *natsjs.RawStreamMsg) bool {
	if m.Header.Get(hdrCtl) != "" {
		return false
	}
	events, err := decodeBatch(m.Data)
	if err != nil || len(events) == 0 {
		return false
	}
	_, ended := protocol.EndOf(events[len(events)-1])
	return ended
}

// OnRunClosed makes f the handler of every run this store closed for a producer that is gone:
// reaped, or taken over and closed by the writer that took it (the first producer would have
// finished what it kept beside the log, a thread). The reaper calls f once its pass has closed
// the logs of all the runs it found expired, so that each gets its terminal first. f must not
// block.
func (s *Store) OnRunClosed(f func(RunInfo)) {
	s.mu.Lock()
	s.runClosed = f
	s.mu.Unlock()
}

// closedLater queues a run closed for a producer that is gone, for closedQueued.
func (s *Store) closedLater(info RunInfo) {
	s.mu.Lock()
	if s.runClosed != nil {
		s.toFinish = append(s.toFinish, info)
	}
	s.mu.Unlock()
}

// closedQueued hands the runs closedLater queued to the OnRunClosed handler.
func (s *Store) closedQueued() {
	s.mu.Lock()
	infos, f := s.toFinish, s.runClosed
	s.toFinish = nil
	s.mu.Unlock()
	for _, info := range infos {
		f(info)
	}
}
