package conversation

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/wsgateway/wsgateway/agent"
	"github.com/wsgateway/wsgateway/internal/tracing"
	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/turn"
)

// CodeReplayDiverged is the RUN_ERROR code of a run taken over whose replay disagreed with
// its stored log (PROTOCOL.md, "Takeover").
const CodeReplayDiverged = "replay_diverged"

// replayDiverged is the terminal a takeover appends when the replay disagrees with the log.
var replayDiverged = []byte(`{"type":"RUN_ERROR","message":"the agent's replay disagrees with the run's log","code":"` + CodeReplayDiverged + `"}`)

// takeoverReadTimeout bounds the read of a taken-over run's thread.
const takeoverReadTimeout = 10 * time.Second

// errDiverged fails the appends of a replay from its first disagreement with the log on.
var errDiverged = errors.New("conversation: the replay disagrees with the run's log")

// takeOver runs again, on this gateway, the turn of a run whose producer died
// (Store.OnTakeover; Config.Replay): the agent is given the run's stored input;
// the events it replays are matched with the stored log by fingerprint and dropped, and
// what follows them is appended to the same log, which readers on any gateway go on reading.
// A replay that disagrees inside the stored part ends the run RUN_ERROR replay_diverged,
// nothing of it appended. It reports false when it cannot (an input it cannot read, the
// gateway shutting down).
func (srv *Server) takeOver(tk Takeover) bool {
	log := srv.log.With(slog.String(keyRunID, tk.Info.RunID), slog.Int("takeover", tk.Info.Takeovers))
	in, err := protocol.DecodeRunAgentInput(tk.Input)
	if err != nil || in.RunID != tk.Info.RunID {
		log.Warn("takeover: the run's stored input is unreadable", slog.Any(keyErr, err))
		srv.cfg.Metrics.TakeoverEnded(metrics.TakeoverRefused)
		return false
	}
	stored := tk.Stored
	if i := slices.IndexFunc(stored, func(e Entry) bool { return protocol.IsRunQueued(e.Event) }); i >= 0 {
		if i == len(stored)-1 {
			// Queued behind earlier runs of its thread and never started: taken over, it would
			// start out of turn. It ends producer_lost, and its client may send it again.
			log.Info("takeover: the run was queued and never started: it ends producer_lost")
			srv.cfg.Metrics.TakeoverEnded(metrics.TakeoverRefused)
			return false
		}
		stored = slices.Delete(slices.Clone(stored), i, i+1) // not the agent's: no replay matches it
	}
	key := runKey{tk.Info.Principal, tk.Info.RunID}
	s, err := srv.turns.adopt(key, srv.cfg.Store.ThreadKey(key.principal, in.ThreadID))
	if err != nil {
		srv.cfg.Metrics.TakeoverEnded(metrics.TakeoverRefused)
		return false
	}
	defer close(s.ready)
	input := in
	if srv.cfg.Threads != nil && in.ThreadID != "" {
		// The agent is given what the first producer's was: the thread's conversation as of
		// the run's acceptance, which the thread keeps while the run is unfinished. A first
		// producer that died before its acceptance reached the thread left the run out of
		// it: it is recorded now, so that its reply lands in the thread at its close.
		ctx, cancel := context.WithTimeout(srv.ctx, takeoverReadTimeout)
		th, err := srv.cfg.Threads.Thread(ctx, key.principal, in.ThreadID)
		if errors.Is(err, ErrUnknownThread) || err == nil && th.RunState(in.RunID) == "" {
			th, err = srv.cfg.Threads.AcceptRun(ctx, key.principal, in.ThreadID, in.RunID, in.JSON(), nil, Overlap{})
		}
		if err != nil {
			log.Warn("takeover: reading the run's thread", slog.String(keyErr, err.Error()))
			th = nil // agentInput gives the agent what the run posted, and says so
		}
		if !srv.cfg.AgentHistoryClient {
			input = srv.agentInput(ctx, key.principal, th, in, trace.SpanFromContext(ctx), log)
		}
		cancel()
	}
	var rl takeoverLog = &replayLog{w: tk.Log, stored: stored}
	replayed := max(len(stored)-1, 0) // the agent's events before the first stored one past run.accepted
	if srv.cfg.Continue {
		cl, reply, err := newContinueLog(tk.Log, stored)
		if err != nil {
			log.Info("takeover: the stored reply cannot be continued", slog.String(keyErr, err.Error()))
			srv.turns.end(s)
			srv.cfg.Metrics.TakeoverEnded(metrics.TakeoverRefused)
			return false
		}
		if reply != nil {
			input = input.WithMessages(append(slices.Clip(input.Messages), *reply))
		}
		rl, replayed = cl, 0
	}
	log.Info("taking over a run whose producer died", slog.Int("stored", len(stored)), slog.Bool("continued", srv.cfg.Continue))
	ctx, span := srv.startTakeoverSpan(tk, in.ThreadID)
	t, err := turn.Start(turn.Config{
		Input:        input,
		Agent:        srv.cfg.Agent,
		Log:          rl,
		Logger:       log,
		Metrics:      srv.cfg.Metrics,
		CloseTimeout: srv.cfg.TurnCloseTimeout,
		Limits:       srv.cfg.TurnLimits,
		Context:      agent.WithReplay(ctx, replayed),
		OnEnd: func(metrics.Outcome) {
			srv.turns.end(s)
			srv.cfg.Metrics.TakeoverEnded(rl.outcome())
			span.End()
		},
		// The dead producer never stored the terminal, so never recorded the run's usage;
		// a record is keyed by the log's generation, so a second one would count nothing.
		Used: srv.usageRecorder(key, in.ThreadID, tk.Info.Generation),
	})
	if err != nil {
		srv.turns.end(s)
		srv.cfg.Metrics.TakeoverEnded(metrics.TakeoverRefused)
		endRefused(span, string(metrics.TakeoverRefused), "")
		return false
	}
	if srv.turns.started(s, t) {
		t.Abort()
	}
	return true
}

// startTakeoverSpan returns the context of the turn of a takeover, with its span, which the
// caller ends: a child of the run's first turn (its metadata keeps its trace context), so the
// run's trace shows the turn, the takeover and what the new producer appended. With tracing
// off it returns the server's context and noSpan.
func (srv *Server) startTakeoverSpan(tk Takeover, threadID string) (context.Context, trace.Span) {
	if srv.tracer == nil {
		return srv.ctx, noSpan
	}
	ctx := srv.ctx
	if sc := tracing.Parse(tk.Info.TraceParent, tk.Info.TraceState); sc.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	return srv.tracer.Start(ctx, tracing.SpanTakeover, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			tracing.KeyRunID.String(tk.Info.RunID),
			tracing.KeyThreadID.String(threadID),
			tracing.KeyPrincipalHash.String(tracing.PrincipalHash(tk.Info.Principal)),
			tracing.KeyTakeovers.Int(tk.Info.Takeovers),
			tracing.KeyEvents.Int(len(tk.Stored)),
		))
}

// takeoverLog is the log of a takeover's turn: a replayLog, or a continueLog.
type takeoverLog interface {
	turn.Log
	WaitRoom(ctx context.Context) error
	outcome() metrics.TakeoverOutcome
}

// replayLog is a takeover's log (turn.Log): the first events appended are the agent's
// replay of what the log stores, matched one by one by fingerprint and answered with their
// stored offsets; the rest goes to the writer. The first mismatch appends replayDiverged and
// fails every append from then on.
type replayLog struct {
	w      RunLog
	stored []Entry

	mu       sync.Mutex
	matched  int // stored events the replay matched
	appended bool
	diverged bool
}

// Append implements turn.Log.
func (l *replayLog) Append(event []byte, stored func(offset string, err error)) {
	l.mu.Lock()
	switch {
	case l.diverged:
		l.mu.Unlock()
		stored("", errDiverged)
		return
	case l.matched < len(l.stored):
		e := l.stored[l.matched]
		if fingerprint(event) == fingerprint(e.Event) {
			l.matched++
			l.mu.Unlock()
			stored(e.Offset, nil)
			return
		}
		if isRunError(event) {
			// The turn ended during the replay (an abort, a shutdown, the agent's failure):
			// its terminal follows what is stored.
			l.matched, l.appended = len(l.stored), true
			l.mu.Unlock()
			l.w.Append(event, stored)
			return
		}
		l.diverged = true
		l.mu.Unlock()
		l.w.Append(replayDiverged, func(string, error) {})
		stored("", errDiverged)
		return
	}
	l.appended = true
	l.mu.Unlock()
	l.w.Append(event, stored)
}

// WaitRoom bounds what waits to be stored, as the writer does.
func (l *replayLog) WaitRoom(ctx context.Context) error { return l.w.WaitRoom(ctx) }

// Close implements turn.Log.
func (l *replayLog) Close(ctx context.Context) error { return l.w.Close(ctx) }

// Lost implements turn.Log.
func (l *replayLog) Lost() <-chan struct{} { return l.w.Lost() }

// outcome names how the takeover went, once its turn ended.
func (l *replayLog) outcome() metrics.TakeoverOutcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.diverged:
		return metrics.TakeoverDiverged
	case l.w.Err() != nil:
		return metrics.TakeoverFailed
	}
	return metrics.TakeoverContinued
}

// isRunError reports whether event is a RUN_ERROR.
func isRunError(event []byte) bool {
	end, ok := protocol.EndOf(event)
	return ok && end.Kind == protocol.EndError
}

// fingerprint returns an event's identity for matching a replay with the log: the event
// without its timestamp and its metadata (where agents put times: the demo's emitMicros,
// @tanstack/ai's createdAt), which a replay cannot reproduce. A replay must reproduce
// everything else, ids included.
func fingerprint(event []byte) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(event, &m) != nil {
		return string(event)
	}
	maps.DeleteFunc(m, func(k string, _ json.RawMessage) bool { return k == "timestamp" || k == "metadata" })
	var b bytes.Buffer
	json.NewEncoder(&b).Encode(m) // a map's keys in order; values as stored
	return b.String()
}

// continueLog is the log of a takeover that continues the stored reply (Config.Continue):
// the agent, given that reply as its last assistant message, starts its answer as a new
// run would. Its RUN_STARTED is the stored one, and so is the start of the message it
// writes first when the log holds one: that message's events get the stored message's id
// (they are dropped when the stored message has ended); the rest is appended as it comes.
type continueLog struct {
	w        RunLog
	started  string // offset of the stored RUN_STARTED ("" when none)
	last     string // offset of the last stored event
	msgID    string // the stored text message's id ("" when none)
	msgStart string // offset of its TEXT_MESSAGE_START
	ended    bool   // its TEXT_MESSAGE_END is stored

	mu         sync.Mutex
	sawStarted bool
	from       string // the id the agent gives the message it continues ("" until its start)
}

// errNotContinuable: what the log stores is not one text reply in progress.
var errNotContinuable = errors.New("the stored events are not a run's start and one text message")

// newContinueLog returns the log of a takeover that continues what stored holds (the
// run.accepted marker, RUN_STARTED, at most one text message) and the assistant message
// that gives the agent the stored reply (nil when no text message is stored).
func newContinueLog(w RunLog, stored []Entry) (*continueLog, *protocol.Message, error) {
	l := &continueLog{w: w}
	var text strings.Builder
	for i, e := range stored {
		var ev struct {
			Type      protocol.EventType `json:"type"`
			Name      string             `json:"name"`
			MessageID string             `json:"messageId"`
			Delta     string             `json:"delta"`
		}
		if err := json.Unmarshal(e.Event, &ev); err != nil {
			return nil, nil, fmt.Errorf("stored event %d: %w", i, err)
		}
		l.last = e.Offset
		switch {
		case i == 0 && ev.Type == protocol.Custom && ev.Name == protocol.RunAcceptedName:
		case ev.Type == protocol.RunStarted && l.started == "":
			l.started = e.Offset
		case ev.Type == protocol.TextMessageStart && l.started != "" && l.msgID == "" && ev.MessageID != "":
			l.msgID, l.msgStart = ev.MessageID, e.Offset
		case ev.Type == protocol.TextMessageContent && l.msgID != "" && !l.ended && ev.MessageID == l.msgID:
			text.WriteString(ev.Delta)
		case ev.Type == protocol.TextMessageEnd && l.msgID != "" && !l.ended && ev.MessageID == l.msgID:
			l.ended = true
		default:
			return nil, nil, fmt.Errorf("%w: event %d is %s", errNotContinuable, i, ev.Type)
		}
	}
	if l.msgID == "" {
		return l, nil, nil
	}
	raw, err := json.Marshal(map[string]string{"id": l.msgID, "role": "assistant", "content": text.String()})
	if err != nil {
		return nil, nil, err
	}
	content, _ := json.Marshal(text.String())
	return l, &protocol.Message{ID: l.msgID, Role: "assistant", Content: content, Raw: raw}, nil
}

// Append implements turn.Log.
func (l *continueLog) Append(event []byte, stored func(offset string, err error)) {
	var ev struct {
		Type      protocol.EventType `json:"type"`
		MessageID string             `json:"messageId"`
	}
	json.Unmarshal(event, &ev) // the turn's pipeline has checked it
	l.mu.Lock()
	switch {
	case ev.Type == protocol.RunStarted && l.started != "" && !l.sawStarted:
		l.sawStarted = true
		l.mu.Unlock()
		stored(l.started, nil)
		return
	case ev.Type == protocol.TextMessageStart && l.msgID != "" && l.from == "":
		l.from = ev.MessageID
		l.mu.Unlock()
		stored(l.msgStart, nil)
		return
	case l.from != "" && ev.MessageID == l.from && (ev.Type == protocol.TextMessageContent || ev.Type == protocol.TextMessageEnd):
		if l.ended {
			l.mu.Unlock()
			stored(l.last, nil)
			return
		}
		if l.from != l.msgID {
			event = withMessageID(event, l.msgID)
		}
	}
	l.mu.Unlock()
	l.w.Append(event, stored)
}

// withMessageID returns event with its messageId set to id.
func withMessageID(event []byte, id string) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(event, &m) != nil {
		return event
	}
	m["messageId"], _ = json.Marshal(id)
	out, err := json.Marshal(m)
	if err != nil {
		return event
	}
	return out
}

// WaitRoom bounds what waits to be stored, as the writer does.
func (l *continueLog) WaitRoom(ctx context.Context) error { return l.w.WaitRoom(ctx) }

// Close implements turn.Log.
func (l *continueLog) Close(ctx context.Context) error { return l.w.Close(ctx) }

// Lost implements turn.Log.
func (l *continueLog) Lost() <-chan struct{} { return l.w.Lost() }

// outcome names how the takeover went, once its turn ended.
func (l *continueLog) outcome() metrics.TakeoverOutcome {
	if l.w.Err() != nil {
		return metrics.TakeoverFailed
	}
	return metrics.TakeoverContinued
}
