package conversation

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/wsgateway/wsgateway/agent"
	"github.com/wsgateway/wsgateway/internal/tracing"
	"github.com/wsgateway/wsgateway/jetstream"
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
// (jetstream.Store.OnTakeover; Config.Replay): the agent is given the run's stored input;
// the events it replays are matched with the stored log by fingerprint and dropped, and
// what follows them is appended to the same log, which readers on any gateway go on reading.
// A replay that disagrees inside the stored part ends the run RUN_ERROR replay_diverged,
// nothing of it appended. It reports false when it cannot (an input it cannot read, the
// gateway shutting down).
func (srv *Server) takeOver(tk jetstream.Takeover) bool {
	log := srv.log.With(slog.String(keyRunID, tk.Info.RunID), slog.Int("takeover", tk.Info.Takeovers))
	in, err := protocol.DecodeRunAgentInput(tk.Input)
	if err != nil || in.RunID != tk.Info.RunID {
		log.Warn("takeover: the run's stored input is unreadable", slog.Any(keyErr, err))
		srv.cfg.Metrics.TakeoverEnded(metrics.TakeoverRefused)
		return false
	}
	key := runKey{tk.Info.Principal, tk.Info.RunID}
	s, err := srv.turns.adopt(key, srv.cfg.Store.ThreadKey(key.principal, in.ThreadID))
	if err != nil {
		srv.cfg.Metrics.TakeoverEnded(metrics.TakeoverRefused)
		return false
	}
	defer close(s.ready)
	input := in
	if srv.cfg.Threads != nil && in.ThreadID != "" && !srv.cfg.AgentHistoryClient {
		// The agent is given what the first producer's was: the thread's conversation as of
		// the run's acceptance, which the thread keeps while the run is unfinished.
		ctx, cancel := context.WithTimeout(srv.ctx, takeoverReadTimeout)
		th, err := srv.cfg.Threads.Thread(ctx, key.principal, in.ThreadID)
		if err != nil {
			log.Warn("takeover: reading the run's thread", slog.String(keyErr, err.Error()))
			th = nil // agentInput gives the agent what the run posted, and says so
		}
		input = srv.agentInput(ctx, th, in, trace.SpanFromContext(ctx), log)
		cancel()
	}
	rl := &replayLog{w: tk.Writer, stored: tk.Stored}
	log.Info("taking over a run whose producer died", slog.Int("stored", len(tk.Stored)))
	ctx, span := srv.startTakeoverSpan(tk, in.ThreadID)
	t, err := turn.Start(turn.Config{
		Input:        input,
		Agent:        srv.cfg.Agent,
		Log:          rl,
		Logger:       log,
		Metrics:      srv.cfg.Metrics,
		CloseTimeout: srv.cfg.TurnCloseTimeout,
		Limits:       srv.cfg.TurnLimits,
		// The agent's events before the first stored one past run.accepted are a replay.
		Context: agent.WithReplay(ctx, max(len(tk.Stored)-1, 0)),
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
func (srv *Server) startTakeoverSpan(tk jetstream.Takeover, threadID string) (context.Context, trace.Span) {
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

// replayLog is a takeover's log (turn.Log): the first events appended are the agent's
// replay of what the log stores, matched one by one by fingerprint and answered with their
// stored offsets; the rest goes to the writer. The first mismatch appends replayDiverged and
// fails every append from then on.
type replayLog struct {
	w      *jetstream.Writer
	stored []jetstream.Entry

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
	ev, err := protocol.DecodeEvent(event)
	return err == nil && ev.Type() == protocol.RunError
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
