package conversation

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/internal/quota"
	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/protocol"
)

// serveConversation reads frames until the socket closes, then ends the socket. When its
// reader parks (idle.go), it reads each frame on a goroutine of its own: after the frame, or
// a control frame, it hands the reading on (readNext) to the poller, which starts a new
// goroutine when the next input arrives, or to a new goroutine at once, and returns.
func (c *conn) serveConversation() {
	for {
		typ, data, err := c.read()
		switch {
		case errors.Is(err, errParked): // a control frame was read
		case err != nil:
			c.logEnd(err)
			if c.srv.cfg.AbortOnDisconnect {
				c.srv.turns.abortOwned(c)
			}
			c.unfollowAll()
			c.finish(err)
			c.srv.ended(c)
			return
		case typ != websocket.MessageText:
			c.srv.cfg.Metrics.FrameDropped(metrics.DropBinary)
		default:
			c.hb.Touch()
			c.handle(data)
		}
		if c.out.in != nil {
			c.readNext()
			return
		}
	}
}

// logEnd logs why the reader stopped; normal closes are not errors.
func (c *conn) logEnd(err error) {
	switch websocket.CloseStatus(err) {
	case websocket.StatusNormalClosure, websocket.StatusGoingAway, websocket.StatusNoStatusRcvd:
		c.logAttrs(slog.LevelDebug, "socket closed by peer")
	case -1:
		c.logAttrs(slog.LevelDebug, "socket ended", slog.String(keyErr, err.Error()))
	default:
		c.logAttrs(slog.LevelInfo, "socket closed by peer", slog.Int(keyCode, int(websocket.CloseStatus(err))))
	}
}

// handle dispatches one text frame.
func (c *conn) handle(data []byte) {
	if c.tokenExpired() {
		return
	}
	f, err := protocol.DecodeClientFrame(data)
	switch {
	case errors.Is(err, protocol.ErrNotJSON):
		c.srv.cfg.Metrics.FrameDropped(metrics.DropNotJSON)
		c.logAttrs(slog.LevelDebug, "dropped a frame that is not JSON", slog.Int(keyBytes, len(data)))
	case err != nil:
		c.Deliver("", protocol.AppendRunError(nil, err.Error(), CodeInvalidInput), time.Time{})
	case f.Kind == protocol.FrameAbort:
		c.abort(f.RunID)
	case f.Kind == protocol.FrameAuth:
		c.reauth(f.Token)
	case f.Kind == protocol.FrameFollow:
		c.follow(f.ThreadID)
	case f.Kind == protocol.FrameUnfollow:
		c.unfollow(f.ThreadID)
	case f.Kind == protocol.FrameRun:
		if !c.runFrames.Take(quota.Now(), c.srv.cfg.RunFrameRate, c.srv.cfg.RunFrameBurst) {
			c.logAttrs(slog.LevelDebug, "run frame refused: run-frame-rate", slog.String(keyRunID, f.RunID))
			c.srv.cfg.Metrics.LimitRefused(metrics.LimitRunFrameRate)
			c.Deliver("", protocol.AppendRunError(nil, MsgRunFrameRate, CodeLimitExceeded), time.Time{})
			c.pause()
			return
		}
		c.run(f.Input)
	}
}

// pause holds the socket's reader for Config.RefusalDelay after one of its frames was
// refused by a bound (quota.Pause): the refusal is queued already, the next frame waits.
func (c *conn) pause() { quota.Pause(context.Background(), c.srv.cfg.RefusalDelay) }

// abort stops the principal's turn of runID. A turn this gateway does not run may run on
// another one sharing the store, which the request reaches; the socket also remembers the
// abort until its run frame arrives.
func (c *conn) abort(runID string) {
	if c.srv.turns.abort(runKey{c.principal, runID}, c, c.origin(), c.srv.cfg.EarlyAborts, c.srv.cfg.EarlyAbortTTL) != nil {
		return
	}
	if err := c.srv.cfg.Store.RequestAbort(c.principal, runID, c.origin()); err != nil {
		c.logAttrs(slog.LevelWarn, "abort request to the other gateways", slog.String(keyRunID, runID), slog.String(keyErr, err.Error()))
	}
}

// run starts a turn for a valid run frame. Log creation blocks, so it happens on a goroutine
// owned by the Server (turns outlive sockets); frames after this one are read meanwhile.
func (c *conn) run(in *protocol.RunAgentInput) {
	thread := c.srv.cfg.Store.ThreadKey(c.principal, in.ThreadID)
	s, prev, err := c.srv.turns.add(runKey{c.principal, in.RunID}, thread, c, c.srv.cfg.MaxTurnsPerSocket, c.srv.cfg.EarlyAbortTTL)
	var refused *limitError
	switch {
	case errors.As(err, &refused):
		c.logAttrs(slog.LevelDebug, "run frame refused: "+string(refused.limit), slog.String(keyRunID, in.RunID))
		c.srv.cfg.Metrics.LimitRefused(refused.limit)
		c.Deliver("", protocol.AppendRunError(nil, refused.msg, CodeLimitExceeded), time.Time{})
		c.pause()
		return
	case err != nil:
		return // the socket is closing 1012
	}
	c.hb.TurnStarted()
	s.live = &ownSink{c: c}
	go c.start(turnRequest{slot: s, prev: prev, in: in, values: c.turnCtx, sink: s.live, log: c.logger()})
}

// start starts the turn of a run frame through the Server's one turn-starting path, and
// answers a turn that could not start with its bare RUN_ERROR.
func (c *conn) start(req turnRequest) {
	if _, failure := c.srv.startTurn(req); failure != nil {
		c.Deliver("", failure, time.Time{})
	}
}
