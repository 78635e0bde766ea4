package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/wsgateway/wsgateway/protocol"
)

// ProducerLost is the terminal event the reaper appends to a log whose producer died.
// ProducerLost is the terminal the reaper stores in the log of a run whose producer is gone.
var ProducerLost = []byte(`{"type":"RUN_ERROR","message":"producer lost","code":"producer_lost"}`)

// renewInterval is how often a store renews its liveness key: a fifth of the lease TTL, so
// that a store paused (a collection, a stalled connection) for up to four fifths of it loses
// nothing.
func (s *Store) renewInterval() time.Duration { return s.cfg.LeaseTTL / 5 }

// renewLoop renews the store's liveness key, which stands for the leases of all its
// writers, every renewInterval, and releases the leases forget queued, until Close.
func (s *Store) renewLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.renewInterval())
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(s.ctx, s.cfg.LeaseTTL/2)
			if err := s.renewLive(ctx); err != nil && s.ctx.Err() == nil {
				s.log.Warn("jetstream: liveness key renewal failed", keyErr, err)
			}
			cancel()
		case <-s.kick:
		}
		s.releaseLeases()
	}
}

// renewLive writes the store's liveness key with a new expiry.
func (s *Store) renewLive(ctx context.Context) error {
	_, err := s.live.Put(ctx, s.liveKey, mustJSON(lease{Owner: s.cfg.Owner, Expires: time.Now().Add(s.cfg.LeaseTTL).UnixMilli()}))
	if err != nil {
		s.jsFailed()
		return err
	}
	s.jsAnswered()
	if f := s.cfg.Metrics.LivenessRenewed; f != nil {
		f()
	}
	return nil
}

// releaseLeases marks expired the run leases forget queued, each at the revision its writer
// held: a lease changed meanwhile (a reaper claimed it, a resubmit took it) is no longer ours.
func (s *Store) releaseLeases() {
	s.mu.Lock()
	pending := maps.Clone(s.releases)
	s.mu.Unlock()
	released := mustJSON(lease{Owner: s.cfg.Owner})
	for key, rev := range pending {
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.PublishTimeout)
		_, err := s.leases.Update(ctx, key, released, rev)
		cancel()
		if err != nil && !IsWrongLastSeq(err) && !errors.Is(err, natsjs.ErrKeyNotFound) {
			return // JetStream does not answer: the next tick retries
		}
		s.mu.Lock()
		delete(s.releases, key)
		s.mu.Unlock()
	}
}

// leaseSeen is a lease as the reaper's watcher last saw it.
type leaseSeen struct {
	expires  int64  // Unix milliseconds
	live     string // the liveness key whose expiry counts instead, if any
	revision uint64
}

// reapLoop watches the lease bucket and runs the reaper every ReapInterval until Close.
// The watcher keeps every open run's lease and every store's liveness key in memory, so a
// pass costs no request unless a lease expired. It also tells this store's writers that
// lost their lease.
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
	live := map[string]leaseSeen{} // the stores' liveness keys
	ready := false                 // the watcher's initial values are in
	for {
		if watcher == nil {
			w, err := s.leases.WatchAll(s.ctx)
			if err != nil && s.ctx.Err() == nil {
				s.log.Warn("jetstream: reaper: watch leases", keyErr, err)
			}
			if err == nil {
				watcher, updates = w, w.Updates()
				clear(seen)
				clear(live)
				ready = false
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
			case e == nil:
				ready = true
			case e.Operation() != natsjs.KeyValuePut:
				delete(seen, e.Key())
				delete(live, e.Key())
				s.leaseChanged(e.Key(), e.Revision(), nil)
			default:
				var l lease
				json.Unmarshal(e.Value(), &l)
				if strings.HasPrefix(e.Key(), "live.") {
					live[e.Key()] = leaseSeen{expires: l.Expires, revision: e.Revision()}
					if e.Key() == s.liveKey && l.Expires == 0 {
						s.log.Warn("jetstream: a reaper found this store's liveness key expired: its open runs are being ended")
					}
					continue
				}
				seen[e.Key()] = leaseSeen{expires: l.Expires, live: l.Live, revision: e.Revision()}
				s.leaseChanged(e.Key(), e.Revision(), &l)
			}
		case <-t.C:
			if ready {
				s.reap(s.ctx, seen, live)
			}
		}
	}
}

// leaseChanged fails this store's writer of key when its lease changed hands after the
// writer took it (revision rev, l nil for a deletion): with ErrFenced when a resubmit took
// the run for a newer generation, with ErrLeaseLost otherwise (a reaper claimed it).
func (s *Store) leaseChanged(key string, rev uint64, l *lease) {
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

// leaseLive reports whether the lease l is held: its liveness key, or its own expiry, is
// in the future.
func (s *Store) leaseLive(ctx context.Context, l lease) (bool, error) {
	if l.Live == "" {
		return l.Expires > time.Now().UnixMilli(), nil
	}
	e, err := s.leases.Get(ctx, l.Live)
	if errors.Is(err, natsjs.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	var k lease
	return json.Unmarshal(e.Value(), &k) == nil && k.Expires > time.Now().UnixMilli(), nil
}

// reap closes the logs of open runs whose lease expired: their producer died or was cut off.
// Reapers of several stores claim a run by a compare-and-set on its lease, so one reaps it.
// A lease that names a liveness key expires with it; before claiming such leases, a reaper
// declares the key's store dead by a compare-and-set on the key at the revision it saw
// expire, so that a watcher lagging behind a renewal reaps nothing.
//
// A lease that expired while JetStream did not answer (NATS down, no quorum) may belong to a
// live producer that could not renew it either: the reaper claims expired leases only once
// JetStream has answered this store for a whole LeaseTTL, time for every live producer to
// renew.
func (s *Store) reap(ctx context.Context, seen, live map[string]leaseSeen) {
	now := time.Now().UnixMilli()
	settled := false
	dead := map[string]bool{} // liveness keys this pass found dead, or alive after all
	var expired []reapJob
	for key, l := range seen {
		expires := l.expires
		if l.live != "" {
			expires = live[l.live].expires // 0 when its store deleted it, or was declared dead
		}
		if now < expires {
			continue
		}
		if !settled {
			if !s.jsSettled(ctx) {
				return
			}
			settled = true
		}
		if l.live != "" {
			d, ok := dead[l.live]
			if !ok {
				d = s.declareDead(ctx, l.live, live)
				dead[l.live] = d
			}
			if !d {
				continue
			}
		}
		expired = append(expired, reapJob{key: key, revision: l.revision})
	}
	// Claims and reaps run concurrently, a bounded number at once: the runs of a dead store
	// all expire together.
	claimed := make([]uint64, len(expired))
	var failed atomic.Bool
	var wg sync.WaitGroup
	sem := make(chan struct{}, reapConcurrency)
	for i, j := range expired {
		if failed.Load() || ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			rev, err := s.claimAndReap(ctx, j)
			if err != nil {
				failed.Store(true)
			}
			claimed[i] = rev
		}()
	}
	wg.Wait()
	for i, j := range expired {
		if claimed[i] != 0 {
			seen[j.key] = leaseSeen{expires: now + s.cfg.LeaseTTL.Milliseconds(), revision: claimed[i]}
		}
	}
	s.closedQueued()
}

// reapConcurrency bounds the runs one reaper claims and closes (or takes over) at once. Each
// is a few round trips (a takeover also reads its log), so a dead gateway's runs are taken
// over at a rate that this sets: with 1,000 runs (bench/takeover), 16 took 36 s from the
// kill to the last takeover's first event, 64 took 20 s, 256 take 10 s.
const reapConcurrency = 256

// reapJob is an expired lease: its run key and the revision the reaper saw.
type reapJob struct {
	key      string
	revision uint64
}

// claimAndReap claims the run's expired lease by a compare-and-set at the revision seen, and
// closes its log. It returns the claim's revision (0 when the lease was renewed or claimed
// meanwhile), and an error only when JetStream does not answer.
func (s *Store) claimAndReap(ctx context.Context, j reapJob) (uint64, error) {
	claim := mustJSON(lease{Owner: s.cfg.Owner + " reaper", Expires: time.Now().Add(s.cfg.LeaseTTL).UnixMilli()})
	rev, err := s.leases.Update(ctx, j.key, claim, j.revision)
	if IsWrongLastSeq(err) || errors.Is(err, natsjs.ErrKeyNotFound) {
		return 0, nil // renewed or claimed meanwhile: the watcher brings the news
	}
	if err != nil {
		s.jsFailed()
		return 0, err
	}
	if err := s.reapRun(ctx, j.key, rev); err != nil && ctx.Err() == nil {
		s.log.Warn("jetstream: reap run", keyRunKey, j.key, keyErr, err)
	}
	return rev, nil
}

// declareDead reports whether the store of liveness key k is dead: its key is gone (the
// store closed), was declared dead, or is replaced now by a dead mark (expiry 0) at the
// revision this reaper saw expire. A renewal since then keeps the store alive.
func (s *Store) declareDead(ctx context.Context, k string, live map[string]leaseSeen) bool {
	seen, ok := live[k]
	if !ok || seen.expires == 0 {
		return true
	}
	rev, err := s.leases.Update(ctx, k, mustJSON(lease{Owner: s.cfg.Owner + " reaper"}), seen.revision)
	if err != nil {
		if !IsWrongLastSeq(err) && !errors.Is(err, natsjs.ErrKeyNotFound) {
			s.jsFailed()
		}
		return false
	}
	live[k] = leaseSeen{revision: rev}
	return true
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
		if l, err := s.leases.Get(ctx, key); err != nil || l.Revision() != leaseRev {
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

// dropLease removes a lease left by a run that is closed or gone.
func (s *Store) dropLease(ctx context.Context, key string, rev uint64) error {
	err := s.leases.Delete(ctx, key, natsjs.LastRevision(rev))
	if err != nil && !IsWrongLastSeq(err) && !errors.Is(err, natsjs.ErrKeyNotFound) {
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
