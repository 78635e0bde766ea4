package conversation

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/protocol"
)

// serveResume replays runID's log after offset until the log closes, reading inbound frames
// meanwhile: abort frames are handled as on a conversation socket, others ignored.
func (c *conn) serveResume(runID, offset string) {
	parent := c.turnCtx // the handshake's trace context, if any
	if parent == nil {
		parent = context.Background()
	}
	ctx, cancel := context.WithCancel(parent)
	result := make(chan metrics.ResumeResult, 1)
	if reason := checkResume(runID, offset); reason != "" {
		c.logAttrs(slog.LevelDebug, "resume refused", slog.String(keyReason, reason))
		result <- metrics.ResumeBadRequest
		c.requestClose(websocket.StatusPolicyViolation, reason, false)
	} else {
		c.mu.Lock()
		c.wg.Add(1)
		c.mu.Unlock()
		c.hb.TurnStarted() // a tailing socket never idles out
		go func() {
			defer c.wg.Done()
			r := c.replay(ctx, runID, offset)
			result <- r
		}()
	}
	var end error
	for {
		typ, data, err := c.read()
		if err != nil && !errors.Is(err, errParked) {
			c.logEnd(err)
			end = err
			break
		}
		// An abort frame stops the principal's run wherever it runs, as on a conversation
		// socket: after a drop, the client's only socket may be this one. As there, an abort
		// read after the token's expiry stops nothing: it closes the socket 4401.
		if err == nil && typ == websocket.MessageText {
			if f, err := protocol.DecodeClientFrame(data); err == nil && f.Kind == protocol.FrameAbort && !c.tokenExpired() {
				c.abort(f.RunID)
			}
		}
	}
	cancel()
	c.finish(end)
	c.srv.cfg.Metrics.Resume(metrics.TransportWebSocket, <-result)
}

// checkResume returns the close reason of bad resume parameters, or "".
func checkResume(runID, offset string) string {
	switch {
	case offset == "":
		return "no resume offset"
	case !protocol.ValidRunID(runID):
		return "invalid runId"
	case !validOffset(offset):
		return "invalid offset"
	}
	return ""
}

// validOffset rejects what no minted offset contains (PROTOCOL.md section 3); the Store
// decides the rest.
func validOffset(s string) bool {
	if len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch b := s[i]; {
		case b <= ' ', b == 0x7f:
			return false
		}
	}
	return true
}

// A replay reopens the log after a failure that is neither a bad offset nor an unknown run
// (JetStream API calls time out under load, a stream answers 503 during its leader's
// election), after the last offset sent, so without a gap or a duplicate, for up to
// Config.ReplayPatience from the first failure since it last sent an event, pausing from
// replayBackoff, doubled each time, up to replayBackoffMax. A "now" resume that failed
// before sending anything reopens where it first opened, when the Reader tells it (an
// After method).
const (
	replayBackoff    = 100 * time.Millisecond
	replayBackoffMax = time.Second
)

// replay sends the log's envelopes through the Server's one replay path, then closes the
// socket: 1000 after the log's close, or the close code of the failure.
func (c *conn) replay(ctx context.Context, runID, offset string) metrics.ResumeResult {
	defer c.hb.TurnEnded()
	var arena []byte
	send := func(ctx context.Context, off string, ev []byte) error {
		return c.send(ctx, appendFrame(&arena, off, ev))
	}
	r := c.srv.replay(ctx, c.principal, runID, offset, c.logger(), nil, send)
	switch r {
	case metrics.ResumeCompleted:
		c.requestClose(websocket.StatusNormalClosure, "", true)
	case metrics.ResumeBadRequest:
		c.requestClose(websocket.StatusPolicyViolation, "invalid offset", false)
	case metrics.ResumeUnknownRun:
		c.requestClose(StatusUnknownRun, "unknown or expired run", false)
	case metrics.ResumeFailed:
		c.requestClose(websocket.StatusInternalError, "resume failed", true)
	}
	return r
}

// replayArena sizes the chunks a replay's envelopes are carved from: a catch-up of many
// events costs one allocation per chunk instead of a few per event.
const replayArena = 16 << 10

// appendFrame returns the envelope of event ev at offset off, carved from *arena, which it
// replaces with a new chunk when the envelope does not fit. The envelope's capacity ends
// with it: the next one's bytes are never appended to it.
func appendFrame(arena *[]byte, off string, ev []byte) []byte {
	a := *arena
	if n := len(off) + len(ev) + 20; cap(a)-len(a) < n {
		a = make([]byte, 0, max(replayArena, n))
	}
	f := protocol.AppendEnvelope(a[len(a):], off, ev)
	if len(f) <= cap(a)-len(a) { // carved from a, not reallocated by an escape
		*arena = a[:len(a)+len(f)]
	}
	return f[:len(f):len(f)]
}

// replay is the one replay path, for resume sockets and HTTP streams alike: it reads runID's
// log strictly after offset and hands every event to send, in order, until the log is
// closed (ResumeCompleted). opened, if set, is called each time the log was opened, before
// the events read from it. A send error ends the replay as ResumeInterrupted, as does ctx.
// Failures to open or read the log are retried after the last offset sent
// (Config.ReplayPatience), then end it as ResumeFailed; a bad offset is ResumeBadRequest, an
// unknown run (or another principal's) ResumeUnknownRun.
func (srv *Server) replay(ctx context.Context, principal, runID, offset string, log *slog.Logger,
	opened func(), send func(ctx context.Context, offset string, event []byte) error) (res metrics.ResumeResult) {
	after := offset
	var err error
	rt := srv.newReplayTrace(ctx, principal, runID, offset)
	if rt != nil {
		defer func() { rt.end(res) }()
		send = rt.counting(send)
	}
	var failing time.Time // the first failure since an event was sent
	pause := replayBackoff
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if failing.IsZero() {
				failing, pause = time.Now(), replayBackoff
			}
			if time.Since(failing) >= srv.cfg.ReplayPatience {
				break
			}
			select {
			case <-time.After(pause):
			case <-ctx.Done():
				return metrics.ResumeInterrupted
			}
			pause = min(2*pause, replayBackoffMax)
		}
		var r LogReader
		r, err = srv.cfg.Store.Read(ctx, principal, runID, after)
		switch {
		case err == nil:
		case errors.Is(err, ErrInvalidOffset):
			return metrics.ResumeBadRequest
		case errors.Is(err, ErrUnknownRun):
			return metrics.ResumeUnknownRun
		case ctx.Err() != nil:
			return metrics.ResumeInterrupted
		default:
			log.Info("resume: opening the log", slog.String(keyRunID, runID), slog.String(keyErr, err.Error()))
			continue
		}
		rt.opened(r)
		if after == offset {
			// A "now" resolved: a reader failing before it sent anything is reopened
			// where this one started, not at a later tail.
			after = r.After()
		}
		if opened != nil {
			opened()
		}
		var done, sendFailed bool
		sent := after
		after, done, sendFailed, err = forward(ctx, r, after, send)
		r.Close()
		if after != sent {
			failing = time.Time{}
		}
		switch {
		case done:
			return metrics.ResumeCompleted
		case ctx.Err() != nil || sendFailed:
			return metrics.ResumeInterrupted
		}
		log.Info("resume: reading the log", slog.String(keyRunID, runID), slog.String(keyErr, err.Error()))
	}
	log.Warn("resume failed", slog.String(keyRunID, runID), slog.String(keyErr, err.Error()))
	return metrics.ResumeFailed
}

// forward sends r's events until the log's end (done) or an error, and returns the offset
// of the last event sent (after, when none was); sendFailed tells a send error from a read
// error.
func forward(ctx context.Context, r LogReader, after string, send func(context.Context, string, []byte) error) (last string, done, sendFailed bool, err error) {
	last = after
	for {
		e, err := r.Next(ctx)
		if errors.Is(err, io.EOF) {
			return last, true, false, nil
		}
		if err != nil {
			return last, false, false, err
		}
		if err := send(ctx, e.Offset, e.Event); err != nil {
			return last, false, true, err
		}
		last = e.Offset
	}
}
