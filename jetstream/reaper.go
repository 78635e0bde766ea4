package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
)

// producerLost is the terminal event the reaper appends to a log whose producer died.
var producerLost = []byte(`{"type":"RUN_ERROR","message":"producer lost","code":"producer_lost"}`)

// renewLoop renews the leases of this store's open writers every LeaseTTL/3 until Close.
func (s *Store) renewLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		writers := make([]*Writer, 0, len(s.writers))
		for w := range s.writers {
			writers = append(writers, w)
		}
		s.mu.Unlock()
		for _, w := range writers {
			ctx, cancel := context.WithTimeout(s.ctx, s.cfg.LeaseTTL/2)
			w.renew(ctx)
			cancel()
		}
	}
}

// leaseSeen is a lease as the reaper's watcher last saw it.
type leaseSeen struct {
	expires  int64 // Unix milliseconds
	revision uint64
}

// reapLoop watches the lease bucket and runs the reaper every ReapInterval until Close.
// The watcher keeps every open run's lease in memory, so a pass costs no request unless a
// lease expired.
func (s *Store) reapLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.ReapInterval)
	defer t.Stop()
	var watcher natsjs.KeyWatcher
	defer func() {
		if watcher != nil {
			watcher.Stop()
		}
	}()
	var updates <-chan natsjs.KeyValueEntry
	seen := map[string]leaseSeen{}
	for {
		if watcher == nil {
			w, err := s.leases.WatchAll(s.ctx)
			if err != nil && s.ctx.Err() == nil {
				s.log.Warn("jetstream: reaper: watch leases", keyErr, err)
			}
			if err == nil {
				watcher, updates = w, w.Updates()
				clear(seen)
			}
		}
		select {
		case <-s.ctx.Done():
			return
		case e, ok := <-updates:
			switch {
			case !ok:
				watcher.Stop()
				watcher, updates = nil, nil
			case e == nil: // the initial values are in
			case e.Operation() != natsjs.KeyValuePut:
				delete(seen, e.Key())
			default:
				var l lease
				json.Unmarshal(e.Value(), &l)
				seen[e.Key()] = leaseSeen{expires: l.Expires, revision: e.Revision()}
			}
		case <-t.C:
			s.reap(s.ctx, seen)
		}
	}
}

// reap closes the logs of open runs whose lease expired: their producer died or was cut off.
// Reapers of several stores claim a run by a compare-and-set on its lease, so one reaps it.
//
// A lease that expired while JetStream did not answer (NATS down, no quorum) may belong to a
// live producer that could not renew it either: the reaper claims expired leases only once
// JetStream has answered this store for a whole LeaseTTL, time for every live producer to
// renew (every LeaseTTL/3).
func (s *Store) reap(ctx context.Context, seen map[string]leaseSeen) {
	now := time.Now().UnixMilli()
	settled := false
	for key, l := range seen {
		if now < l.expires {
			continue
		}
		if !settled {
			if !s.jsSettled(ctx) {
				return
			}
			settled = true
		}
		claim := mustJSON(lease{Owner: s.cfg.Owner + " reaper", Expires: time.Now().Add(s.cfg.LeaseTTL).UnixMilli()})
		rev, err := s.leases.Update(ctx, key, claim, l.revision)
		if isWrongLastSeq(err) || errors.Is(err, natsjs.ErrKeyNotFound) {
			continue // renewed or claimed meanwhile: the watcher brings the news
		}
		if err != nil {
			s.jsFailed()
			return
		}
		seen[key] = leaseSeen{expires: now + s.cfg.LeaseTTL.Milliseconds(), revision: rev}
		if err := s.reapRun(ctx, key, rev); err != nil && ctx.Err() == nil {
			s.log.Warn("jetstream: reap run", keyRunKey, key, keyErr, err)
		}
	}
}

// jsSettled reports whether JetStream has answered this store for at least LeaseTTL. When
// nothing tells whether it answers now, it asks (the lease bucket's status), and the LeaseTTL
// counts from that answer.
func (s *Store) jsSettled(ctx context.Context) bool {
	since := s.answering.Load()
	if since == 0 {
		pctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
		_, err := s.leases.Status(pctx)
		cancel()
		if err == nil {
			s.jsAnswered()
		}
		return false
	}
	return time.Now().UnixMilli()-since >= s.cfg.LeaseTTL.Milliseconds()
}

// reapRun appends the producer_lost terminal and the close record to the run's log, fenced
// by the subject's last sequence so that the dead producer's later appends fail. A log whose
// last event is a terminal (RUN_FINISHED or RUN_ERROR: the producer stopped between its
// terminal and its close record) gets the close record alone.
func (s *Store) reapRun(ctx context.Context, key string, leaseRev uint64) error {
	var a *acks
	defer func() { a.release() }()
	for attempt := 0; attempt < 5; attempt++ {
		e, err := s.meta.Get(ctx, key)
		if errors.Is(err, natsjs.ErrKeyNotFound) {
			return s.dropLease(ctx, key, leaseRev)
		}
		if err != nil {
			return err
		}
		var info RunInfo
		if err := json.Unmarshal(e.Value(), &info); err != nil {
			return err
		}
		if info.State != RunOpen {
			return s.dropLease(ctx, key, leaseRev)
		}
		subject, _ := s.subject(info.Principal, info.RunID)
		var last uint64
		terminal := false
		m, err := s.lastMsg(ctx, subject)
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
				return s.finishReaped(ctx, info)
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
		if l, err := s.leases.Get(ctx, key); err != nil || l.Revision() != leaseRev {
			return nil
		}
		id := fmt.Sprintf("reap.%s.%d.%d", key, info.Generation, last)
		if a == nil {
			if a, err = s.newAcks(); err != nil {
				return err
			}
		}
		seq := last
		if !terminal {
			seq, err = s.publishAfter(ctx, a, subject, info.Generation, last, id, encodeBatch(nil, [][]byte{producerLost}), "")
			if errors.Is(err, ErrFenced) {
				continue
			}
			if err != nil {
				return err
			}
		}
		if _, err := s.publishAfter(ctx, a, subject, info.Generation, seq, id+".close", nil, ctlClose); errors.Is(err, ErrFenced) {
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
		if err := s.finishReaped(ctx, info); err != nil {
			return fmt.Errorf("thread: %w", err)
		}
		return nil
	}
	return errors.New("log keeps moving")
}

// dropLease removes a lease left by a run that is closed or gone.
func (s *Store) dropLease(ctx context.Context, key string, rev uint64) error {
	err := s.leases.Delete(ctx, key, natsjs.LastRevision(rev))
	if err != nil && !isWrongLastSeq(err) && !errors.Is(err, natsjs.ErrKeyNotFound) {
		return err
	}
	return nil
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
	var ev struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(events[len(events)-1], &ev) != nil {
		return false
	}
	return ev.Type == "RUN_FINISHED" || ev.Type == "RUN_ERROR"
}
