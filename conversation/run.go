package conversation

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/turn"
)

// Codes of the bare RUN_ERROR events a conversation socket sends itself.
const (
	CodeInvalidInput   = "invalid_input"
	CodeForbidden      = "forbidden"
	CodeLogUnavailable = turn.CodeLogUnavailable

	msgForbidden = "run belongs to another principal"
)

// slot is a runId's place on a conversation socket, from its run frame to its turn's end.
// Guarded by the socket's mu except ready.
type slot struct {
	runID   string
	ready   chan struct{} // closed once the turn started, or failed to
	turn    *turn.Turn    // nil until started; stays nil if it could not start
	aborted bool          // an abort frame arrived
}

// serveConversation reads frames until the socket closes.
func (c *conn) serveConversation() {
	defer c.finish()
	if c.srv.cfg.AbortOnDisconnect {
		defer c.abortAll()
	}
	c.ws.SetReadLimit(c.srv.cfg.ReadLimit)
	for {
		typ, data, err := c.ws.Read(context.Background())
		if err != nil {
			c.logEnd(err)
			return
		}
		if typ != websocket.MessageText {
			c.srv.cfg.Metrics.FrameDropped(metrics.DropBinary)
			continue
		}
		c.hb.Touch()
		c.handle(data)
	}
}

// logEnd logs why the reader stopped; normal closes are not errors.
func (c *conn) logEnd(err error) {
	switch websocket.CloseStatus(err) {
	case websocket.StatusNormalClosure, websocket.StatusGoingAway, websocket.StatusNoStatusRcvd:
		c.log.Debug("socket closed by peer")
	case -1:
		c.log.Debug("socket ended", slog.String(keyError, err.Error()))
	default:
		c.log.Info("socket closed by peer", slog.Int(keyCode, int(websocket.CloseStatus(err))))
	}
}

// handle dispatches one text frame.
func (c *conn) handle(data []byte) {
	f, err := protocol.DecodeClientFrame(data)
	switch {
	case errors.Is(err, protocol.ErrNotJSON):
		c.srv.cfg.Metrics.FrameDropped(metrics.DropNotJSON)
		c.log.Debug("dropped a frame that is not JSON", slog.Int(keyBytes, len(data)))
	case err != nil:
		c.Deliver(protocol.AppendRunError(nil, err.Error(), CodeInvalidInput), time.Time{})
	case f.Kind == protocol.FrameAbort:
		c.abort(f.RunID)
	case f.Kind == protocol.FrameRun:
		c.run(f.Input)
	}
}

// abort stops the turn of runID, or remembers the abort until its run frame arrives.
func (c *conn) abort(runID string) {
	c.mu.Lock()
	s := c.slots[runID]
	if s == nil {
		c.early.add(runID, time.Now(), c.srv.cfg.EarlyAborts, c.srv.cfg.EarlyAbortTTL)
		c.mu.Unlock()
		return
	}
	s.aborted = true
	t := s.turn
	c.mu.Unlock()
	if t != nil {
		t.Abort()
	}
}

// run starts a turn for a valid run frame. Log creation blocks, so it happens on a goroutine
// owned by the Server (turns outlive sockets); frames after this one are read meanwhile.
func (c *conn) run(in *protocol.RunAgentInput) {
	if !c.srv.beginStart() {
		return // shutting down: the socket is closing 1012
	}
	c.mu.Lock()
	if c.slots == nil {
		c.slots = make(map[string]*slot)
	}
	prev := c.slots[in.RunID]
	s := &slot{runID: in.RunID, ready: make(chan struct{})}
	s.aborted = c.early.take(in.RunID, time.Now(), c.srv.cfg.EarlyAbortTTL)
	c.slots[in.RunID] = s
	c.mu.Unlock()
	c.hb.TurnStarted()
	go c.start(s, prev, in)
}

// start creates the run's log and starts its turn; for a resubmit it first aborts the
// previous turn of the runId and waits for it to end.
func (c *conn) start(s *slot, prev *slot, in *protocol.RunAgentInput) {
	srv := c.srv
	defer srv.startWG.Done()
	defer close(s.ready)
	log := c.log.With(slog.String(keyRunID, in.RunID))
	if prev != nil {
		<-prev.ready
		c.mu.Lock()
		pt := prev.turn
		c.mu.Unlock()
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
	runLog, err := srv.cfg.Store.Create(srv.ctx, c.principal, in.RunID, in.ThreadID)
	if err != nil {
		if errors.Is(err, ErrForbidden) {
			log.Info("run refused: another principal's runId")
			c.Deliver(protocol.AppendRunError(nil, msgForbidden, CodeForbidden), time.Time{})
		} else {
			log.Warn("creating run log", slog.String(keyError, err.Error()))
			c.Deliver(protocol.AppendRunError(nil, turn.MsgLogUnavailable, CodeLogUnavailable), time.Time{})
		}
		c.endSlot(s)
		return
	}
	srv.mu.Lock()
	t, err := turn.Start(turn.Config{
		Input:        in,
		Agent:        srv.cfg.Agent,
		Log:          runLog,
		Sink:         c,
		Logger:       log,
		Metrics:      srv.cfg.Metrics,
		CloseTimeout: srv.cfg.TurnCloseTimeout,
		OnEnd:        func(metrics.Outcome) { c.endSlot(s) },
	})
	if err != nil {
		srv.mu.Unlock()
		log.Error("starting turn", slog.String(keyError, err.Error()))
		runLog.Close(context.WithoutCancel(srv.ctx))
		c.endSlot(s)
		return
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
	c.mu.Lock()
	s.turn = t
	aborted := s.aborted
	c.mu.Unlock()
	if aborted {
		t.Abort()
	}
}

// abortAll aborts every turn of the socket, and those still starting.
func (c *conn) abortAll() {
	c.mu.Lock()
	var turns []*turn.Turn
	for _, s := range c.slots {
		s.aborted = true
		if s.turn != nil {
			turns = append(turns, s.turn)
		}
	}
	c.mu.Unlock()
	for _, t := range turns {
		t.Abort()
	}
}

// endSlot forgets a slot whose turn ended (or never started).
func (c *conn) endSlot(s *slot) {
	c.mu.Lock()
	if c.slots[s.runID] == s {
		delete(c.slots, s.runID)
		if len(c.slots) == 0 {
			c.slots = nil // an idle socket holds no map
		}
	}
	c.mu.Unlock()
	c.hb.TurnEnded()
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
