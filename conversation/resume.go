package conversation

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/protocol"
)

// serveResume replays runID's log after offset until the log closes, reading and ignoring
// inbound frames meanwhile.
func (c *conn) serveResume(runID, offset string) {
	c.ws.SetReadLimit(c.srv.cfg.ReadLimit)
	ctx, cancel := context.WithCancel(context.Background())
	result := make(chan metrics.ResumeResult, 1)
	if reason := checkResume(runID, offset); reason != "" {
		c.log.Debug("resume refused", slog.String(keyReason, reason))
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
	for {
		_, rd, err := c.ws.Reader(ctx)
		if err == nil {
			_, err = io.Copy(io.Discard, rd)
		}
		if err != nil {
			c.logEnd(err)
			break
		}
	}
	cancel()
	c.finish()
	c.srv.cfg.Metrics.Resume(<-result)
}

// checkResume returns the close reason of bad resume parameters, or "".
func checkResume(runID, offset string) string {
	switch {
	case offset == "":
		return "no resume offset"
	case !validRunID(runID):
		return "invalid runId"
	case !validOffset(offset):
		return "invalid offset"
	}
	return ""
}

// validRunID accepts non-empty printable UTF-8 of bounded length.
func validRunID(s string) bool {
	if s == "" || len(s) > maxRunIDLen || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
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

// Attempts of a replay to open (or reopen) the log after a failure that is neither a bad
// offset nor an unknown run: JetStream API calls time out under load, and a reader can be
// reopened after the last offset sent without a gap or a duplicate. (A "now" resume that
// failed before sending anything reopens at the then current tail.)
const (
	replayAttempts = 4
	replayBackoff  = 100 * time.Millisecond
)

// replay sends the log's envelopes, then closes the socket: 1000 after the log's close, or
// the close code of the failure.
func (c *conn) replay(ctx context.Context, runID, offset string) metrics.ResumeResult {
	defer c.hb.TurnEnded()
	after := offset
	var err error
	for attempt := 0; attempt < replayAttempts; attempt++ {
		if attempt > 0 {
			select {
			case <-time.After(replayBackoff << (attempt - 1)):
			case <-ctx.Done():
				return metrics.ResumeInterrupted
			}
		}
		var r Reader
		r, err = c.srv.cfg.Store.Read(ctx, c.principal, runID, after)
		switch {
		case err == nil:
		case errors.Is(err, ErrInvalidOffset):
			c.requestClose(websocket.StatusPolicyViolation, "invalid offset", false)
			return metrics.ResumeBadRequest
		case errors.Is(err, ErrUnknownRun):
			c.requestClose(StatusUnknownRun, "unknown or expired run", false)
			return metrics.ResumeUnknownRun
		case ctx.Err() != nil:
			return metrics.ResumeInterrupted
		default:
			c.log.Info("resume: opening the log", slog.String(keyRunID, runID), slog.String(keyError, err.Error()))
			continue
		}
		var done bool
		after, done, err = c.forward(ctx, r, after)
		r.Close()
		switch {
		case done:
			c.requestClose(websocket.StatusNormalClosure, "", true)
			return metrics.ResumeCompleted
		case ctx.Err() != nil || errors.Is(err, errSocketClosed):
			return metrics.ResumeInterrupted
		}
		c.log.Info("resume: reading the log", slog.String(keyRunID, runID), slog.String(keyError, err.Error()))
	}
	c.log.Warn("resume failed", slog.String(keyRunID, runID), slog.String(keyError, err.Error()))
	c.requestClose(websocket.StatusInternalError, "resume failed", true)
	return metrics.ResumeFailed
}

// forward sends r's envelopes until the log's end (done) or an error, and returns the offset
// of the last envelope sent (after, when none was).
func (c *conn) forward(ctx context.Context, r Reader, after string) (last string, done bool, err error) {
	last = after
	for {
		off, ev, err := r.Next(ctx)
		if errors.Is(err, io.EOF) {
			return last, true, nil
		}
		if err != nil {
			return last, false, err
		}
		if err := c.send(ctx, protocol.AppendEnvelope(nil, off, ev)); err != nil {
			return last, false, err
		}
		last = off
	}
}
