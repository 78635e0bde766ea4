package conversation

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"

	"go.opentelemetry.io/otel/trace"

	"github.com/wsgateway/wsgateway/internal/tracing"
	"github.com/wsgateway/wsgateway/jetstream"
	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/thread"
	"github.com/wsgateway/wsgateway/threadstore"
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
	return a.Agent.Run(ctx, a.srv.agentInput(ctx, a.l.written, in, a.span, a.log), emit)
}

// agentInput returns in with the messages its agent is given: the thread's transcript as the
// run's acceptance wrote it (t; nil when that write failed: then in as posted, which is
// logged), with the replies of the runs accepted before it that t holds as running but whose
// logs end with their terminal (withEarlierRuns), converted for the agent and merged with what
// the run posted, cut to AgentHistoryBytes. The cut is logged at Debug and recorded on the
// turn's span.
func (srv *Server) agentInput(ctx context.Context, t *threadstore.Thread, in *protocol.RunAgentInput, span trace.Span, log *slog.Logger) *protocol.RunAgentInput {
	if t == nil {
		log.WarnContext(ctx, "agent history: the run's thread could not be written, the agent gets the messages the run posted")
		return in
	}
	tr := srv.withEarlierRuns(ctx, t, in, log)
	msgs := tr.Context(in.RunID)
	if t.Sealed != nil {
		// The older messages, from the thread's records: as many as the budget may take.
		older, err := srv.cfg.Threads.SealedMessages(ctx, t, srv.cfg.AgentHistoryBytes)
		if err != nil {
			log.WarnContext(ctx, "agent history: reading the thread's older messages", slog.String(keyErr, err.Error()))
		}
		msgs = append(older, msgs...)
	}
	input, w := thread.AgentInput(thread.AgentMessages(msgs), in.Messages, srv.cfg.AgentHistoryBytes)
	span.SetAttributes(tracing.KeyHistoryMessages.Int(w.Messages), tracing.KeyHistoryBytes.Int(w.Bytes),
		tracing.KeyHistoryDropped.Int(w.Dropped))
	if w.Dropped > 0 {
		log.DebugContext(ctx, "agent history cut to agent-history-bytes",
			slog.Int("messages", w.Messages), slog.Int("bytes", w.Bytes),
			slog.Int("dropped", w.Dropped), slog.Int("droppedBytes", w.DroppedBytes))
	}
	return in.WithMessages(input)
}

// maxEarlierRuns bounds the earlier runs a run's start reads (withEarlierRuns): the newest.
const maxEarlierRuns = 4

// withEarlierRuns returns t's transcript with the events of each run accepted before in's
// that t holds as running and whose log ends with its terminal: a client that saw a reply's
// terminal may post its next message before that run's gateway finished its thread (it does
// once the run's log is closed), and the reply belongs in the next run's context. A run still
// streaming is left out (its reply is not settled). The newest maxEarlierRuns such runs are
// read, none while the memory budget admits no new work; a log that cannot be read is logged
// and left out. A run of this gateway that just ended is not read: its thread log's events
// are at hand (Server.settled). The transcript returned is only the agent's context: the
// earlier runs are applied with FinishContext, which leaves their messages' metadata unmerged.
func (srv *Server) withEarlierRuns(ctx context.Context, t *threadstore.Thread, in *protocol.RunAgentInput, log *slog.Logger) thread.Transcript {
	tr := t.Transcript
	var earlier []string
	for _, r := range t.Runs {
		if r.RunID == in.RunID {
			break
		}
		if r.State == threadstore.ThreadRunRunning && tr.Anchored(r.RunID) {
			earlier = append(earlier, r.RunID)
		}
	}
	if len(earlier) > maxEarlierRuns {
		log.DebugContext(ctx, "agent history: earlier runs of the thread left unread", slog.Int("unread", len(earlier)-maxEarlierRuns))
		earlier = earlier[len(earlier)-maxEarlierRuns:]
	}
	cloned := false
	for _, runID := range earlier {
		if v, ok := srv.settled.Load(runKey{t.Principal, runID}); ok {
			// A run of this gateway that just ended: its events are at hand.
			if !cloned {
				tr, cloned = tr.Clone(), true
			}
			if err := tr.FinishContext(runID, v.([]json.RawMessage)); err != nil {
				log.WarnContext(ctx, "agent history: applying an earlier run of the thread", slog.String("earlierRunId", runID), slog.String(keyErr, err.Error()))
			}
			continue
		}
		if !srv.cfg.Budget.Admit() {
			log.WarnContext(ctx, "agent history: earlier runs of the thread left unread: memory-budget")
			break
		}
		rctx, cancel := context.WithTimeout(ctx, threadTimeout)
		entries, _, err := srv.cfg.Store.Snapshot(rctx, t.Principal, runID)
		cancel()
		if err != nil {
			if !errors.Is(err, jetstream.ErrUnknownRun) {
				log.WarnContext(ctx, "agent history: reading an earlier run of the thread", slog.String("earlierRunId", runID), slog.String(keyErr, err.Error()))
			}
			continue
		}
		release := srv.charge(entries)
		if n := len(entries); n > 0 && terminal(entries[n-1].Event) {
			if !cloned {
				tr, cloned = tr.Clone(), true
			}
			if err := tr.FinishContext(runID, threadstore.Events(entries)); err != nil {
				log.WarnContext(ctx, "agent history: applying an earlier run of the thread", slog.String("earlierRunId", runID), slog.String(keyErr, err.Error()))
			}
		}
		release()
	}
	return tr
}

// terminal reports whether event is a RUN_FINISHED or a RUN_ERROR.
func terminal(event []byte) bool {
	_, ended := protocol.EndOf(event)
	return ended
}
