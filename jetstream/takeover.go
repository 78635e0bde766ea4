package jetstream

import (
	"context"
	"errors"
	"fmt"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/wsgateway/wsgateway/internal/bucket"
)

// ctlTakeover is the control record a takeover writes first: it fences out the dead (or
// partitioned) producer, whose next publish expects the sequence before it. Its body is the
// offset of the last event before it (empty when none), which a reader starting at the log's
// tail resolves FromNow to. Readers skip it.
const ctlTakeover = "takeover"

// DefaultMaxTakeovers is Config.MaxTakeovers' default.
const DefaultMaxTakeovers = 3

// CreateOption is an option of Store.Create.
type CreateOption func(*createOptions)

type createOptions struct {
	input []byte
}

// WithInput keeps input, the run's input as its agent received it, in the log's open
// record, so that another store can take the run over if its producer dies
// (Store.OnTakeover): the run's metadata then says Replay. An input larger than
// Config.MaxBatchBytes is not kept, and the run is reaped as any other.
func WithInput(input []byte) CreateOption {
	return func(o *createOptions) { o.input = input }
}

// Takeover is a run whose producer died, claimed by this store for the handler of
// OnTakeover: its log goes on after Stored through Writer, which holds the run's lease; the
// dead producer is fenced out. The handler feeds Writer from a replay of Input and closes it.
type Takeover struct {
	Info   RunInfo
	Input  []byte  // what WithInput kept
	Stored []Entry // the events the log holds, in order
	Writer *Writer
}

// OnTakeover makes f the handler of runs kept with WithInput whose producer died: instead of
// ending such a run with producer_lost, this store's reaper claims it (at most
// Config.MaxTakeovers times in the run's life) and hands it to f, which must not block. f
// returns false when it cannot take the run: the writer then ends the log with
// producer_lost, as the reaper would have.
func (s *Store) OnTakeover(f func(Takeover) bool) {
	s.mu.Lock()
	s.takeover = f
	s.mu.Unlock()
}

// takeOver claims the run of key, whose lease the reaper holds at leaseRev and whose
// metadata e (info) is open, and hands it to the takeover handler. last is the subject's
// last message, which holds no terminal. It reports false, with nothing written, when the
// run cannot be taken over (no input kept, taken over too often, no handler), and the reaper
// reaps it; true when the run is the handler's, or was left to the next pass (the log moved,
// the claim was overtaken).
func (s *Store) takeOver(ctx context.Context, key string, e natsjs.KeyValueEntry, info RunInfo, sh *shard, last *natsjs.RawStreamMsg, leaseRev uint64) (bool, error) {
	s.mu.Lock()
	handler := s.takeover
	s.mu.Unlock()
	if handler == nil || !info.Replay || info.Takeovers >= s.cfg.MaxTakeovers || last == nil {
		return false, nil
	}
	subject, _ := sh.subject(info.Principal, info.RunID)
	open, err := sh.stream.GetMsg(ctx, 1, natsjs.WithGetMsgSubject(subject))
	if err != nil {
		return false, fmt.Errorf("takeover: open record: %w", err)
	}
	if open.Header.Get(hdrCtl) != ctlOpen || msgGen(open.Header) != info.Generation || len(open.Data) == 0 {
		return false, nil
	}
	stored, _, err := s.Snapshot(ctx, info.Principal, info.RunID)
	if err != nil {
		return false, fmt.Errorf("takeover: %w", err)
	}
	// The lease passes from the reaper's claim to this store's liveness, then the metadata
	// names the new producer; the control record after last fences the old one out. A step
	// that fails gives the lease back expired, for the next pass.
	leaseRev, err = s.leases.Move(ctx, key, info.Generation, leaseRev)
	if err != nil {
		if bucket.IsWrongLastSeq(err) || errors.Is(err, natsjs.ErrKeyNotFound) {
			return true, nil // claimed meanwhile
		}
		return true, fmt.Errorf("takeover: lease: %w", err)
	}
	giveBack := func(err error) (bool, error) {
		s.leases.GiveBack(ctx, key, leaseRev)
		return true, err
	}
	info.Owner = s.cfg.Owner
	info.Takeovers++
	metaRev, err := s.meta.Update(ctx, key, info.appendJSON(nil), e.Revision())
	if err != nil {
		return giveBack(fmt.Errorf("takeover: metadata: %w", err))
	}
	after := ""
	if len(stored) > 0 {
		after = stored[len(stored)-1].Offset
	}
	a, err := s.newAcks()
	if err != nil {
		return giveBack(fmt.Errorf("takeover: %w", err))
	}
	w := s.newWriter(key, info, sh, claim{leaseRev: leaseRev, metaRev: metaRev})
	w.acks, w.takenOver = a, true
	w.msgIDPre += fmt.Sprintf("t%d.", info.Takeovers)
	w.lastSeq = last.Sequence
	if _, err := w.publish(ctx, []byte(after), ctlTakeover); err != nil {
		a.release()
		if errors.Is(err, ErrFenced) {
			return giveBack(nil) // the log moved: its producer lives
		}
		return giveBack(fmt.Errorf("takeover: %w", err))
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		a.release()
		return giveBack(ErrClosed)
	}
	s.writers[w] = struct{}{}
	old := s.byKey[key]
	s.byKey[key] = w
	s.mu.Unlock()
	if old != nil {
		old.fail(ErrFenced) // the run's producer was this store's: it learns at once
	}
	go w.loop()
	if !handler(Takeover{Info: info, Input: open.Data, Stored: stored, Writer: w}) {
		w.Append(ProducerLost, func(string, error) {})
		w.Close(ctx)
	}
	return true, nil
}
