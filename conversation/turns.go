package conversation

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/coder/websocket"
	"go.opentelemetry.io/otel/trace"

	"github.com/wsgateway/wsgateway/internal/quota"
	"github.com/wsgateway/wsgateway/internal/tracing"
	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/turn"
	"github.com/wsgateway/wsgateway/usage"
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
	// MsgMemoryBudget is the message of the bare RUN_ERROR (code limit_exceeded) of a turn
	// refused while the gateway's memory budget admits no new work (Config.Budget).
	MsgMemoryBudget = "memory-budget: the gateway holds too much memory to start a turn now; try again shortly"
	// CodeBudgetExceeded and MsgBudgetExceeded are the RUN_ERROR that ends a run whose
	// principal has used its token budget of the period (Config.Usage), before its agent is
	// called.
	CodeBudgetExceeded = "budget_exceeded"
	MsgBudgetExceeded  = "token-budget: this principal has used its token budget of the period; it renews with the next period"
	// CodeThreadBusy and MsgThreadBusy refuse a run whose multitaskStrategy is reject while
	// another run of its thread is active (THREADS.md section 6): a bare RUN_ERROR, no log
	// created (over HTTP, 409); or, when the other run was accepted on another gateway at
	// the same moment, the RUN_ERROR that ends the run after run.accepted.
	CodeThreadBusy = "thread_busy"
	MsgThreadBusy  = "the thread has a run in progress: send again once it has ended, or with multitaskStrategy concurrent"
)

// Values of a run's multitaskStrategy (THREADS.md section 6), and of Config.Multitask.
const (
	MultitaskEnqueue    = "enqueue"
	MultitaskInterrupt  = "interrupt"
	MultitaskRollback   = "rollback"
	MultitaskReject     = "reject"
	MultitaskConcurrent = "concurrent"
)

// runKey names a run in the registry: a runId belongs to one principal.
type runKey struct{ principal, runID string }

// slot is a run's place in the registry, from its run frame (or POST) to its turn's end.
// Its fields but key, owner and ready are guarded by the registry's mu.
type slot struct {
	key       runKey
	thread    string        // the thread's key (Store.ThreadKey)
	owner     *conn         // the conversation socket whose run frame started it; nil over HTTP
	ready     chan struct{} // closed once the turn started, or failed to
	turn      *turn.Turn    // nil until started; stays nil if it could not start
	aborted   bool          // an abort arrived
	announced bool          // its thread's followers may hear of it (announce)
	foreign   bool          // an abort arrived from elsewhere than the owner's socket
	live      *ownSink      // the owner's sink; nil over HTTP
	// busyWith is the thread's active run that refused this run before its log was created
	// (multitaskStrategy reject), set by startTurn for its caller.
	busyWith string
}

// registry is the Server's one record of turns, keyed by principal and runId, whatever
// transport started them: a slot lives from its run frame (or POST) to its turn's end. It
// implements the resubmit rule (a runId started again aborts its running turn first), lets
// an abort of the principal reach the turn from any socket, counts each conversation
// socket's turns (Config.MaxTurnsPerSocket) and keeps its early aborts, bounds each
// principal's turns and starts, whatever door started them (Config.MaxTurnsPerPrincipal,
// Config.TurnStartRate), and lets Shutdown wait for every turn and stop the rest.
type registry struct {
	mu       sync.Mutex
	slots    map[runKey]*slot
	closing  bool // Shutdown began: no new slot
	stopping bool // Shutdown stops turns: one that starts now is stopped at once
	wg       sync.WaitGroup

	// limits returns a principal's bounds; nil: no per-principal bound (every client is one
	// principal). running counts each principal's keys in slots, starts meters its adds.
	limits  func(principal string) PrincipalLimits
	running quota.Counts
	starts  quota.Rates
}

// errClosing is add's error once Shutdown began.
var errClosing = errors.New("conversation: shutting down")

// add registers a slot for key, a run of the thread key thread, and returns it with the slot
// it replaces (a resubmit), if any. owner, the conversation socket of the run frame (nil over
// HTTP), may hold at most max keys: a new key beyond is refused with errTooManyTurns. The
// key's principal may hold at most its limits' Turns keys (errPrincipalTurns), and each add
// takes a token of its bucket (errTurnRate). An abort of the key that owner remembers younger
// than ttl marks the new slot aborted. Once Shutdown began, add fails with errClosing. A
// refused add changes nothing but the bucket a start refused for its rate found empty.
func (r *registry) add(key runKey, thread string, owner *conn, max int, ttl time.Duration) (s, prev *slot, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return nil, nil, errClosing
	}
	prev = r.slots[key]
	if owner != nil && (prev == nil || prev.owner != owner) && owner.turnCount >= max {
		return nil, nil, errTooManyTurns
	}
	if r.limits != nil {
		l := r.limits(key.principal)
		if prev == nil && r.running.Held(key.principal) >= l.Turns {
			return nil, nil, errPrincipalTurns
		}
		if !r.starts.Take(key.principal, quota.Now(), l.TurnRate, l.TurnBurst) {
			return nil, nil, &limitError{limit: errTurnRate.limit, msg: errTurnRate.msg, retryAfter: r.starts.Wait(key.principal, l.TurnRate, l.TurnBurst)}
		}
		if prev == nil {
			r.running.Take(key.principal, l.Turns)
		}
	}
	if r.slots == nil {
		r.slots = make(map[runKey]*slot)
	}
	s = &slot{key: key, thread: thread, owner: owner, ready: make(chan struct{})}
	if owner != nil {
		s.aborted = owner.early.take(key.runID, time.Now(), ttl)
	}
	r.count(prev, -1)
	r.count(s, 1)
	r.slots[key] = s
	r.wg.Add(1)
	return s, prev, nil
}

// adopt registers a slot for key, a run of the thread key thread taken over from a dead
// gateway (Server.takeOver): it counts among its principal's running turns, beyond their
// bound if need be (it was admitted where it started), and takes nothing of its bucket.
// Once Shutdown began, adopt fails with errClosing.
func (r *registry) adopt(key runKey, thread string) (*slot, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return nil, errClosing
	}
	if r.slots[key] != nil {
		return nil, errors.New("conversation: the run is running here")
	}
	if r.limits != nil {
		r.running.Take(key.principal, math.MaxInt)
	}
	if r.slots == nil {
		r.slots = make(map[runKey]*slot)
	}
	s := &slot{key: key, thread: thread, ready: make(chan struct{})}
	r.slots[key] = s
	r.wg.Add(1)
	return s, nil
}

// count adds d to the turns of s's owner. r.mu is held.
func (r *registry) count(s *slot, d int) {
	if s != nil && s.owner != nil {
		s.owner.turnCount += d
	}
}

// end forgets a slot whose turn ended (or never started); it is a slot's last step.
func (r *registry) end(s *slot) {
	r.mu.Lock()
	if r.slots[s.key] == s {
		delete(r.slots, s.key)
		r.count(s, -1)
		if r.limits != nil {
			r.running.Put(s.key.principal)
		}
	}
	foreign := s.foreign
	r.mu.Unlock()
	if s.owner != nil {
		// The owner's socket learns how its turn ended when another client aborted it.
		if foreign && s.live != nil {
			s.owner.catchUp(s.key.runID, s.live.lastOffset())
		}
		s.owner.hb.TurnEnded()
	}
	r.wg.Done()
}

// abort stops the turn of key, now or as soon as it starts, and returns its slot, nil if
// the registry holds none. Without one, from, the socket of the abort frame (nil for a request of
// another gateway or over HTTP), remembers the abort (max entries of age ttl) until its run
// frame arrives. origin names the socket that asked (conn.origin, "" for none): an abort
// from elsewhere than the turn's socket makes the turn's end reach that socket from the log
// (conn.catchUp).
func (r *registry) abort(key runKey, from *conn, origin string, max int, ttl time.Duration) *slot {
	r.mu.Lock()
	s := r.slots[key]
	if s == nil {
		if from != nil {
			from.early.add(key.runID, time.Now(), max, ttl)
		}
		r.mu.Unlock()
		return nil
	}
	if s.owner != nil && origin != s.owner.origin() {
		s.foreign = true
	}
	r.mu.Unlock()
	r.abortSlot(s)
	return s
}

// interrupt stops the running turn of key with code interrupted (a newer run of its thread
// takes its place); a turn not started yet is aborted when it starts.
func (r *registry) interrupt(key runKey) {
	r.mu.Lock()
	s := r.slots[key]
	var t *turn.Turn
	if s != nil {
		if t = s.turn; t == nil {
			s.aborted = true
		}
	}
	r.mu.Unlock()
	if t != nil {
		t.Interrupt()
	}
}

// wait waits until s's turn ended and the registry forgot s (its place freed), or ctx ends.
func (r *registry) wait(ctx context.Context, s *slot) error {
	select {
	case <-s.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	r.mu.Lock()
	t := s.turn
	r.mu.Unlock()
	if t == nil { // it never started: startTurn ended it before closing ready
		return nil
	}
	return t.Wait(ctx) // OnEnd, which ends s, runs before Wait returns
}

// aborted reports whether an abort of s arrived.
func (r *registry) aborted(s *slot) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return s.aborted
}

// abortSlot stops s's turn, now or as soon as it starts.
func (r *registry) abortSlot(s *slot) {
	r.mu.Lock()
	s.aborted = true
	t := s.turn
	r.mu.Unlock()
	if t != nil {
		t.Abort()
	}
}

// abortOwned aborts every turn that the socket owner started, and those still starting.
func (r *registry) abortOwned(owner *conn) {
	r.mu.Lock()
	var slots []*slot
	for _, s := range r.slots {
		if s.owner == owner {
			slots = append(slots, s)
		}
	}
	r.mu.Unlock()
	for _, s := range slots {
		r.abortSlot(s)
	}
}

// started records s's running turn and reports whether it must be aborted (an abort
// arrived while it started). Once Shutdown stops turns, it stops t itself.
func (r *registry) started(s *slot, t *turn.Turn) (aborted bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s.turn = t
	if r.stopping {
		t.Shutdown()
	}
	return s.aborted
}

// close refuses new slots; Shutdown's first step.
func (r *registry) close() {
	r.mu.Lock()
	r.closing = true
	r.mu.Unlock()
}

// stop ends every running turn with code shutdown, and those that start from now on.
func (r *registry) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopping = true
	for _, s := range r.slots {
		if s.turn != nil {
			s.turn.Shutdown()
		}
	}
}

// turnRequest starts a turn: a slot the registry added (and the slot it replaces, for a
// resubmit), the valid input, and where the turn's events go.
type turnRequest struct {
	slot, prev *slot
	in         *protocol.RunAgentInput
	values     context.Context // values for the agent (Config.TurnContext); nil: none
	sink       turn.Sink
	log        *slog.Logger
}

// startTurn is the one path from a valid RunAgentInput to a running turn, for sockets and
// HTTP alike. For a resubmit it aborts the previous turn of the key and waits for it to end
// (Config.ResubmitWait); then it creates the run's log and starts the turn. The slot ends
// when the turn has ended, or before startTurn returns if it could not start. It returns
// the turn, or nil and the bare RUN_ERROR to send instead.
func (srv *Server) startTurn(req turnRequest) (*turn.Turn, []byte) {
	accepted := time.Now()
	s := req.slot
	defer close(s.ready)
	log := req.log.With(slog.String(keyRunID, s.key.runID))
	if !srv.cfg.Budget.Admit() {
		// Before a resubmit aborts the turn it replaces: nothing running gives way.
		srv.turns.end(s)
		log.Info("run refused: memory-budget")
		srv.cfg.Metrics.LimitRefused(metrics.LimitMemoryBudget)
		return nil, protocol.AppendRunError(nil, MsgMemoryBudget, CodeLimitExceeded)
	}
	var refused *turn.Refusal
	if srv.cfg.Usage.Exceeded(s.key.principal) {
		// The run is created and ends at once, so that its thread shows why.
		log.Info("run refused: token-budget")
		srv.cfg.Metrics.LimitRefused(metrics.LimitTokenBudget)
		refused = &turn.Refusal{Code: CodeBudgetExceeded, Message: MsgBudgetExceeded}
	}
	strategy := cmp.Or(req.in.MultitaskStrategy, srv.cfg.Multitask, MultitaskEnqueue)
	ctx, span := srv.startTurnSpan(req)
	if req.prev != nil {
		srv.endPrevious(req.prev, log)
	}
	// The run's thread is read while its log is created, and written once the log exists:
	// a run that could not be created (another principal's runId, the store unavailable)
	// never shows in the thread. The thread's write and the run's first event go out
	// together (turn.Config.Thread), and nobody hears of the run before the thread knows it: its
	// first event is delivered, and the run announced to the thread's followers, once the
	// write is done. A client that received an event and then hydrates finds the run
	// active, or finished.
	var ahead ThreadAhead
	var overlap Overlap // the zero Overlap: concurrent
	threaded := srv.cfg.Threads != nil && req.in.ThreadID != ""
	if threaded {
		ahead = srv.cfg.Threads.ReadThreadAhead(srv.ctx, s.key.principal, req.in.ThreadID)
		if strategy != MultitaskConcurrent {
			overlap = Overlap{Ended: srv.runEnded(s.key.principal), Queue: strategy != MultitaskReject, Rollback: strategy == MultitaskRollback}
		}
		if strategy == MultitaskReject {
			// The thread is read before the log is created: a run refused creates none.
			// A read that fails leaves the question to AcceptRun, which asks it again.
			if active := srv.busyWith(ahead, s.key, req.in.ThreadID, overlap.Ended); active != "" {
				srv.turns.end(s)
				s.busyWith = active
				log.InfoContext(ctx, "run refused: thread busy", slog.String("activeRunId", active))
				endRefused(span, "refused", CodeThreadBusy)
				return nil, protocol.AppendRunError(nil, MsgThreadBusy, CodeThreadBusy)
			}
		}
	}
	// The run's metadata keeps the turn's trace context, for the replays of any gateway.
	createCtx := srv.ctx
	if span.IsRecording() {
		createCtx = trace.ContextWithSpan(srv.ctx, span)
	}
	var input []byte // kept for a takeover
	if srv.cfg.Replay {
		input = req.in.JSON()
	}
	runLog, err := srv.cfg.Store.Create(createCtx, s.key.principal, s.key.runID, req.in.ThreadID, input)
	if err != nil {
		srv.turns.end(s)
		if errors.Is(err, ErrForbidden) {
			log.InfoContext(ctx, "run refused: another principal's runId")
			endRefused(span, "refused", CodeForbidden)
			return nil, protocol.AppendRunError(nil, msgForbidden, CodeForbidden)
		}
		log.WarnContext(ctx, "creating run log", slog.String(keyErr, err.Error()))
		endRefused(span, string(metrics.OutcomeLogFailed), CodeLogUnavailable)
		return nil, protocol.AppendRunError(nil, turn.MsgLogUnavailable, CodeLogUnavailable)
	}
	var tr *threadRun
	var record turn.Thread // nil unless threaded: a nil *threadRun is not a nil turn.Thread
	agent := srv.cfg.Agent
	if threaded {
		tr = srv.newThreadRun(s, req.in, ahead, overlap, strategy == MultitaskInterrupt || strategy == MultitaskRollback, log)
		record = tr
		if !srv.cfg.AgentHistoryClient {
			agent = contextAgent{Agent: agent, srv: srv, l: tr, span: span, log: log}
		}
	} else {
		srv.announce(s, log)
	}
	srv.turns.mu.Lock()
	early := s.aborted // an abort that came before the run frame, or while the log opened
	srv.turns.mu.Unlock()
	t, err := turn.Start(turn.Config{
		Input:        req.in,
		Agent:        agent,
		Log:          runLog,
		Thread:       record,
		Sink:         req.sink,
		Logger:       log,
		Metrics:      srv.cfg.Metrics,
		CloseTimeout: srv.cfg.TurnCloseTimeout,
		Limits:       srv.cfg.TurnLimits,
		Context:      ctx,
		OnEnd: func(metrics.Outcome) {
			srv.turns.end(s)
			span.End()
		},
		OnLost:   movedAway(s),
		Aborted:  early,
		Accepted: accepted,
		Refused:  refusedBy(refused, tr),
		Queued:   queuedBy(tr),
		Used:     srv.usageRecorder(s.key, req.in.ThreadID, runLog.Info().Generation),
	})
	if err != nil {
		log.ErrorContext(ctx, "starting turn", slog.String(keyErr, err.Error()))
		err := runLog.Close(context.WithoutCancel(srv.ctx))
		if record != nil {
			record.Closed(err)
		}
		srv.turns.end(s)
		endRefused(span, string(metrics.OutcomeLogFailed), CodeLogUnavailable)
		return nil, protocol.AppendRunError(nil, turn.MsgLogUnavailable, CodeLogUnavailable)
	}
	if srv.turns.started(s, t) {
		t.Abort()
	}
	return t, nil
}

// movedAway returns the turn.Config.OnLost of s's turn: a socket whose turn lost its log's
// lease to another gateway (this one was cut from NATS, and the run was taken over or reaped
// there), or whose log stopped storing mid-turn (its end is then written by a takeover or a
// reaper once the lease is released or expires), is closed 1012 "run moved" once its queued
// frames are written, so that its client reconnects, through any gateway, and resumes from
// the last offset it received. nil over HTTP, whose streams get the bare RUN_ERROR
// log_unavailable.
func movedAway(s *slot) func() {
	if s.owner == nil {
		return nil
	}
	return func() { s.owner.requestClose(websocket.StatusServiceRestart, reasonRunMoved, true) }
}

// reasonRunMoved is the close reason of movedAway.
const reasonRunMoved = "run moved"

// usageRecorder returns the turn.Config.Used of a run whose log is of generation gen: it
// records the run's usage in the ledger, nil without one.
func (srv *Server) usageRecorder(key runKey, threadID string, gen uint64) func(map[string]metrics.Usage) {
	if srv.cfg.Usage == nil {
		return nil
	}
	return func(byModel map[string]metrics.Usage) {
		srv.cfg.Usage.Record(usage.Run{Principal: key.principal, ThreadID: threadID, RunID: key.runID, Generation: gen, Usage: byModel})
	}
}

// refusedBy returns the refusal of a turn: refused (the token budget's), else, for a run
// its thread refused (threadRun.refusal; tr is nil for a run in no thread), that. The turn
// asks once the run.accepted marker is stored, which waits for the thread's write.
func refusedBy(refused *turn.Refusal, tr *threadRun) func() *turn.Refusal {
	return func() *turn.Refusal {
		if tr != nil && refused == nil {
			return tr.refusal.Load()
		}
		return refused
	}
}

// queuedBy returns the turn.Config.Queued of a turn: its threadRun's (tr is nil for a run in
// no thread, which never waits).
func queuedBy(tr *threadRun) func() *turn.Queue {
	if tr == nil {
		return nil
	}
	return tr.queued
}

// busyWith returns the run of the thread read ahead, other than key's, that is still
// active, "" when none or when the read failed.
func (srv *Server) busyWith(ahead ThreadAhead, key runKey, threadID string, ended Ended) string {
	ctx, cancel := context.WithTimeout(srv.ctx, threadTimeout)
	defer cancel()
	active, _ := ahead.BusyWith(ctx, key.principal, threadID, key.runID, ended)
	return active
}

// runEnded returns the Ended of the principal's runs: a run of this gateway that
// stored its terminal is at hand (Server.settled), another's log is asked (Store.Ended), and
// a run with no log is not active.
func (srv *Server) runEnded(principal string) Ended {
	return func(ctx context.Context, runID string) (bool, error) {
		if _, ok := srv.settled.Load(runKey{principal, runID}); ok {
			return true, nil
		}
		ended, err := srv.cfg.Store.Ended(ctx, principal, runID)
		if errors.Is(err, ErrUnknownRun) {
			return true, nil
		}
		return ended, err
	}
}

// endRefused ends the span of a turn that could not start: outcome refused (another
// principal's runId) or log_failed.
func endRefused(span trace.Span, outcome, code string) {
	tracing.SetOutcome(span, outcome, code)
	span.End()
}

// announce tells the followers of the run's thread, on every gateway, that the run of s
// exists (its log does), and lets this gateway's answers to their queries name it.
func (srv *Server) announce(s *slot, log *slog.Logger) {
	srv.turns.mu.Lock()
	s.announced = true
	srv.turns.mu.Unlock()
	if err := srv.cfg.Store.Announce(s.thread, Announcement{RunID: s.key.runID, Origin: originOf(s.owner)}); err != nil {
		log.Warn("announcing the run to its thread's followers", slog.String(keyErr, err.Error()))
	}
}

// endPrevious aborts the turn a resubmit replaces and waits for it to end, at most
// Config.ResubmitWait.
func (srv *Server) endPrevious(prev *slot, log *slog.Logger) {
	<-prev.ready
	srv.turns.mu.Lock()
	pt := prev.turn
	srv.turns.mu.Unlock()
	if pt == nil {
		return
	}
	pt.Abort()
	ctx, cancel := context.WithTimeout(srv.ctx, srv.cfg.ResubmitWait)
	defer cancel()
	if err := pt.Wait(ctx); err != nil {
		log.Warn("resubmit: previous turn still running", slog.String(keyErr, err.Error()))
	}
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
