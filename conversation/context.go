package conversation

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"

	"go.opentelemetry.io/otel/trace"

	"github.com/wsgateway/wsgateway/internal/tracing"
	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/turn"
)

// contextAgent is the agent of a run of a thread whose messages come from the thread
// (THREADS.md section 5): every door's turn starts through startTurn, which gives it this one.
type contextAgent struct {
	turn.Agent
	srv  *Server
	l    *threadRun
	span trace.Span // the turn's
	log  *slog.Logger
}

// Run runs the agent on the run's input with its messages from the thread. The turn starts
// the agent once the run's first event is stored, which waits for the first try of the run's
// acceptance in its thread: the thread is there to read, without a round trip of its own.
func (a contextAgent) Run(ctx context.Context, in *protocol.RunAgentInput, emit func([]byte) error) error {
	<-a.l.accepted
	return a.Agent.Run(ctx, a.srv.agentInput(ctx, a.l.principal, a.l.written, in, a.span, a.log), emit)
}

// agentInput returns in with the messages its agent is given: the thread's transcript as the
// run's acceptance wrote it (t; nil when that write failed: then in as posted, which is
// logged), with the replies of the runs accepted before it that t holds as running but whose
// logs end with their terminal (earlierRuns), converted for the agent and merged with what the
// run posted, cut to AgentHistoryBytes (Threads.AgentMessages). The cut is logged at
// Debug and recorded on the turn's span.
func (srv *Server) agentInput(ctx context.Context, principal string, t Thread, in *protocol.RunAgentInput, span trace.Span, log *slog.Logger) *protocol.RunAgentInput {
	if t == nil {
		log.WarnContext(ctx, "agent history: the run's thread could not be written, the agent gets the messages the run posted")
		return in
	}
	earlier, release := srv.earlierRuns(ctx, principal, t, in.RunID, log)
	input, w, err := srv.cfg.Threads.AgentMessages(ctx, t, in.RunID, earlier, in.Messages, srv.cfg.AgentHistoryBytes)
	release()
	if err != nil {
		log.WarnContext(ctx, "agent history: left out what could not be read", slog.String(keyErr, err.Error()))
	}
	span.SetAttributes(tracing.KeyHistoryMessages.Int(w.Messages), tracing.KeyHistoryBytes.Int(w.Bytes),
		tracing.KeyHistoryDropped.Int(w.Dropped))
	if w.Dropped > 0 {
		log.DebugContext(ctx, "agent history cut to agent-history-bytes",
			slog.Int("messages", w.Messages), slog.Int("bytes", w.Bytes),
			slog.Int("dropped", w.Dropped), slog.Int("droppedBytes", w.DroppedBytes))
	}
	return in.WithMessages(input)
}

// maxEarlierRuns bounds the earlier runs a run's start reads (earlierRuns): the newest.
const maxEarlierRuns = 4

// earlierRuns returns the events of each run accepted before runID that t holds as running
// and whose log ends with its terminal (Thread.EarlierRuns): a client that saw a
// reply's terminal may post its next message before that run's gateway finished its thread
// (it does once the run's log is closed), and the reply belongs in the next run's context. A
// run still streaming is left out (its reply is not settled). The newest maxEarlierRuns such
// runs are read, none while the memory budget admits no new work; a log that cannot be read
// is logged and left out. A run of this gateway that just ended is not read: its events are
// at hand (Server.settled). The logs read are charged to the memory budget until release.
func (srv *Server) earlierRuns(ctx context.Context, principal string, t Thread, runID string, log *slog.Logger) (earlier []RunEvents, release func()) {
	ids := t.EarlierRuns(runID)
	if len(ids) > maxEarlierRuns {
		log.DebugContext(ctx, "agent history: earlier runs of the thread left unread", slog.Int("unread", len(ids)-maxEarlierRuns))
		ids = ids[len(ids)-maxEarlierRuns:]
	}
	var releases []func()
	release = func() {
		for _, r := range releases {
			r()
		}
	}
	for _, id := range ids {
		if v, ok := srv.settled.Load(runKey{principal, id}); ok {
			earlier = append(earlier, RunEvents{RunID: id, Events: v.([]json.RawMessage)})
			continue
		}
		if !srv.cfg.Budget.Admit() {
			log.WarnContext(ctx, "agent history: earlier runs of the thread left unread: memory-budget")
			break
		}
		rctx, cancel := context.WithTimeout(ctx, threadTimeout)
		entries, _, err := srv.cfg.Store.Snapshot(rctx, principal, id)
		cancel()
		if err != nil {
			if !errors.Is(err, ErrUnknownRun) {
				log.WarnContext(ctx, "agent history: reading an earlier run of the thread", slog.String("earlierRunId", id), slog.String(keyErr, err.Error()))
			}
			continue
		}
		if n := len(entries); n > 0 && terminal(entries[n-1].Event) {
			releases = append(releases, srv.charge(entries))
			earlier = append(earlier, RunEvents{RunID: id, Events: eventsOf(entries)})
		}
	}
	return earlier, release
}

// terminal reports whether event is a RUN_FINISHED or a RUN_ERROR.
func terminal(event []byte) bool {
	_, ended := protocol.EndOf(event)
	return ended
}
