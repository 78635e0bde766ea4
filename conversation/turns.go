package conversation

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/wsgateway/wsgateway/jetstream"
	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/turn"
)

// Codes of the bare RUN_ERROR events the gateway sends itself when a turn cannot start.
const (
	CodeInvalidInput   = "invalid_input"
	CodeForbidden      = "forbidden"
	CodeLogUnavailable = turn.CodeLogUnavailable
	CodeLimitExceeded  = turn.CodeLimitExceeded

	msgForbidden = "run belongs to another principal"
	// MsgTooManyTurns and MsgRunFrameRate are the messages of the bare RUN_ERROR (code
	// limit_exceeded) of a run frame over Config.MaxTurnsPerSocket or Config.RunFrameRate.
	MsgTooManyTurns = "max-socket-turns: too many turns running on this socket"
	MsgRunFrameRate = "run-frame-rate: too many run frames per second on this socket"
)

// slot is a runId's place in a turnSet, from its run frame (or POST) to its turn's end.
// Guarded by the set's mu except ready.
type slot struct {
	key     string
	ready   chan struct{} // closed once the turn started, or failed to
	turn    *turn.Turn    // nil until started; stays nil if it could not start
	aborted bool          // an abort arrived
}

// turnSet is the turns of one scope, keyed by runId: a conversation socket's, or the HTTP
// transport's (keyed by principal and runId). It implements the resubmit rule (a runId
// started again aborts its running turn first) and remembers early aborts.
type turnSet struct {
	mu    sync.Mutex
	slots map[string]*slot
	early earlyAborts
}

// add registers a slot for key and returns it with the slot it replaces (a resubmit), if
// any. An abort of key remembered younger than ttl marks the new slot aborted. With max > 0,
// a new key when the set holds max slots is refused: add returns nil, nil.
func (ts *turnSet) add(key string, ttl time.Duration, max int) (s, prev *slot) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.slots == nil {
		ts.slots = make(map[string]*slot)
	}
	prev = ts.slots[key]
	if prev == nil && max > 0 && len(ts.slots) >= max {
		return nil, nil
	}
	s = &slot{key: key, ready: make(chan struct{})}
	s.aborted = ts.early.take(key, time.Now(), ttl)
	ts.slots[key] = s
	return s, prev
}

// abort stops the turn of key, or remembers the abort (bounded by max and ttl) until its
// slot is added.
func (ts *turnSet) abort(key string, max int, ttl time.Duration) {
	ts.mu.Lock()
	s := ts.slots[key]
	if s == nil {
		ts.early.add(key, time.Now(), max, ttl)
		ts.mu.Unlock()
		return
	}
	ts.mu.Unlock()
	ts.abortSlot(s)
}

// abortSlot stops s's turn, now or as soon as it starts.
func (ts *turnSet) abortSlot(s *slot) {
	ts.mu.Lock()
	s.aborted = true
	t := s.turn
	ts.mu.Unlock()
	if t != nil {
		t.Abort()
	}
}

// abortAll aborts every turn of the set, and those still starting.
func (ts *turnSet) abortAll() {
	ts.mu.Lock()
	var slots []*slot
	for _, s := range ts.slots {
		slots = append(slots, s)
	}
	ts.mu.Unlock()
	for _, s := range slots {
		ts.abortSlot(s)
	}
}

// remove forgets a slot whose turn ended (or never started).
func (ts *turnSet) remove(s *slot) {
	ts.mu.Lock()
	if ts.slots[s.key] == s {
		delete(ts.slots, s.key)
		if len(ts.slots) == 0 {
			ts.slots = nil // an idle socket holds no map
		}
	}
	ts.mu.Unlock()
}

// startTurn is the one path from a valid RunAgentInput to a running turn, for sockets and
// HTTP alike. The caller has called beginStart and ts.add. For a resubmit it aborts the
// previous turn of the key and waits for it to end (Config.ResubmitWait); then it creates the
// run's log and starts the turn, delivering to sink, its agent given the values of values
// (nil: none). onEnd runs once: when the turn has
// ended, or before startTurn returns if it could not start. It returns the turn, or nil and
// the bare RUN_ERROR to send instead (nil too when the Server shut down meanwhile).
func (srv *Server) startTurn(ts *turnSet, s, prev *slot, principal string, in *protocol.RunAgentInput,
	values context.Context, sink turn.Sink, log *slog.Logger, onEnd func()) (*turn.Turn, []byte) {
	defer srv.startWG.Done()
	defer close(s.ready)
	log = log.With(slog.String(keyRunID, in.RunID))
	if prev != nil {
		<-prev.ready
		ts.mu.Lock()
		pt := prev.turn
		ts.mu.Unlock()
		if pt != nil {
			pt.Abort()
			ctx, cancel := context.WithTimeout(srv.ctx, srv.cfg.ResubmitWait)
			err := pt.Wait(ctx)
			cancel()
			if err != nil {
				log.Warn("resubmit: previous turn still running", slog.String(keyError, err.Error()))
			}
		}
	}
	runLog, err := srv.cfg.Store.Create(srv.ctx, principal, in.RunID, in.ThreadID)
	if err != nil {
		onEnd()
		if errors.Is(err, jetstream.ErrForbidden) {
			log.Info("run refused: another principal's runId")
			return nil, protocol.AppendRunError(nil, msgForbidden, CodeForbidden)
		}
		log.Warn("creating run log", slog.String(keyError, err.Error()))
		return nil, protocol.AppendRunError(nil, turn.MsgLogUnavailable, CodeLogUnavailable)
	}
	ts.mu.Lock()
	early := s.aborted // an abort that came before the run frame, or while the log opened
	ts.mu.Unlock()
	srv.mu.Lock()
	t, err := turn.Start(turn.Config{
		Input:        in,
		Agent:        srv.cfg.Agent,
		Log:          runLog,
		Sink:         sink,
		Logger:       log,
		Metrics:      srv.cfg.Metrics,
		CloseTimeout: srv.cfg.TurnCloseTimeout,
		Limits:       srv.cfg.TurnLimits,
		Context:      values,
		OnEnd:        func(metrics.Outcome) { onEnd() },
		Aborted:      early,
	})
	if err != nil {
		srv.mu.Unlock()
		log.Error("starting turn", slog.String(keyError, err.Error()))
		runLog.Close(context.WithoutCancel(srv.ctx))
		onEnd()
		return nil, protocol.AppendRunError(nil, turn.MsgLogUnavailable, CodeLogUnavailable)
	}
	srv.turns[t] = struct{}{}
	srv.turnWG.Add(1)
	srv.mu.Unlock()
	go func() {
		// Owned by the Server: ends with the turn, which Shutdown stops.
		<-t.Done()
		srv.mu.Lock()
		delete(srv.turns, t)
		srv.mu.Unlock()
		srv.turnWG.Done()
	}()
	ts.mu.Lock()
	s.turn = t
	aborted := s.aborted
	ts.mu.Unlock()
	if aborted {
		t.Abort()
	}
	return t, nil
}

// earlyAborts remembers aborts whose run frame has not arrived, capped in size and age.
type earlyAborts map[string]time.Time

// add remembers runID, evicting expired entries and, when full, the oldest.
func (e *earlyAborts) add(runID string, now time.Time, max int, ttl time.Duration) {
	if *e == nil {
		*e = make(earlyAborts)
	}
	m := *e
	var oldest string
	for id, at := range m {
		if now.Sub(at) >= ttl {
			delete(m, id)
		} else if oldest == "" || at.Before(m[oldest]) {
			oldest = id
		}
	}
	if _, ok := m[runID]; !ok && len(m) >= max {
		delete(m, oldest)
	}
	m[runID] = now
}

// take reports whether an abort of runID younger than ttl is remembered, and forgets it.
func (e *earlyAborts) take(runID string, now time.Time, ttl time.Duration) bool {
	at, ok := (*e)[runID]
	if !ok {
		return false
	}
	delete(*e, runID)
	if len(*e) == 0 {
		*e = nil // an idle socket holds no map
	}
	return now.Sub(at) < ttl
}
