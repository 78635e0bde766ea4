// Package turn runs one turn: one run frame and everything its agent produces.
//
// Start launches a Turn that, in order (PROTOCOL.md section 2, "A turn, step by step"):
//
//  1. appends the run.accepted marker to the run's log and delivers it, before the agent is
//     asked for anything, so a joiner never finds an empty log;
//  2. runs the agent; every event it emits goes through the protocol pipeline (legacy upgrade,
//     schema, chunk expansion, verification), is appended to the log and, once stored, is
//     delivered to the sink with its offset, in order (persist before deliver);
//  3. when the agent's stream ends (not at the first RUN_FINISHED), appends the terminal the
//     protocol demands: nothing if the sequence is terminated, else RUN_ERROR with code
//     incomplete, agent_error, protocol_violation, limit_exceeded, aborted (Abort),
//     shutdown (Shutdown) or that of Config.Refused (which the agent never sees),
//     preceded by the synthetic ends of open chunk streams (protocol.Pipeline.Fail); never a
//     RUN_ERROR right after a RUN_ERROR, which the verifier refuses (the log already ends
//     with a terminal);
//  4. waits for every append to be acknowledged and closes the log;
//  5. with Config.Thread, the run's record beside its log (a conversation's thread), keeps
//     it in step: every event goes to Thread.Keep as it is appended; the marker is stored
//     and the run recorded in its thread at once, and the marker is delivered once both
//     are done (stored, then in its thread, then delivered); once the log is closed,
//     Thread.Closed records the run's end there.
//
// Every log a Turn is handed ends closed, with a terminal event before the close, unless the
// log itself failed (an append error or a lost lease): then the turn ends at once and, when
// its terminal could not be stored, the sink receives a bare RUN_ERROR (code
// log_unavailable), or, once its marker was stored and Config.OnLost is set, OnLost is
// called instead: the log's end is then written elsewhere (a takeover or a reaper).
//
// Limits (Config.Limits; defaults where it leaves a field zero) bound
// what one run may store, since neither the agent nor the client is trusted with the log's
// size: an event larger than Limits.MaxEventBytes, or one emitted once the run holds
// Limits.MaxEvents events or would take it past Limits.MaxBytes bytes, is refused (emit
// returns an error wrapping ErrLimit) and the turn ends with RUN_ERROR code limit_exceeded,
// whose message names the limit. The limits are checked before each agent event, on the
// events stored so far; an event that passes is stored whole, so a chunk expanded into up to
// three events can take the run two events past MaxEvents. An agent that emits nothing for
// Limits.IdleTimeout is cancelled, and the turn ends the same way.
//
// Live delivery runs on the log's writer goroutine: the callback that learns an event is
// stored calls Sink.Deliver, so that an event reaches its socket without a hand-off. That
// goroutine also commits the run's next batch, so Deliver must not block and its work must
// be bounded (the sinks frame the event and queue it); the log is the buffer. A detached
// turn (no sink) does no delivery work at all. When the log bounds what waits to be stored
// (a WaitRoom method, as *jetstream.Writer has), emit waits while the run's backlog is full,
// until the agent's context ends. The socket going away does not stop the turn; Detach only
// stops live delivery. After Abort nothing more is delivered live.
//
// The Turn owns two goroutines, its driver and the agent's; Done is closed when both have
// returned and the log is closed. Agents must return soon after their context is cancelled:
// one that has not returned Config.AgentStopTimeout after it is left running, refused every
// emit, and the turn ends without it (Done does not wait for it).
package turn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/protocol"
)

// Thread is the record a run is kept in beside its log: a conversation's thread. A turn
// keeps it in step with the log (Config.Thread): the run's first event, its marker, is stored
// and the run recorded in its thread at the same time, and the marker is delivered only once
// both are done (Accepted), so that nobody hears of a run its thread does not know; every
// event appended is handed to Keep first, in order; once the log is closed, Closed lets the
// thread record how the run ended.
type Thread interface {
	// Accepted is closed once the run is recorded in its thread, or the first attempt to
	// record it failed (the thread then retries on its own).
	Accepted() <-chan struct{}
	// Keep is handed each event about to be appended, and whether it is the run's terminal
	// (RUN_FINISHED or RUN_ERROR), from the turn's goroutines one at a time; it must not
	// block.
	Keep(event []byte, terminal bool)
	// Closed is called once, from the driver, when the turn closed its log: err is the
	// close's error (a log that failed is left to whoever ends it: a reaper, a resubmit). It
	// returns once the run's end is in its thread, or the thread gave up.
	Closed(err error)
}

// Log is the run's durable log, as *jetstream.Writer provides it.
type Log interface {
	// Append hands event to the log without blocking; stored is called once, with the
	// event's offset or an error, in append order, from the log's goroutine.
	Append(event []byte, stored func(offset string, err error))
	// Close flushes and closes the log: readers reach its end.
	Close(ctx context.Context) error
	// Lost is closed when the writer lost its lease (its appends are refused).
	Lost() <-chan struct{}
}

// roomWaiter is a Log that bounds what waits to be stored, as *jetstream.Writer does: emit
// calls WaitRoom before each agent event, so a producer faster than the log waits (until its
// context ends) instead of filling memory.
type roomWaiter interface {
	WaitRoom(ctx context.Context) error
}

// Agent produces the AG-UI events of a turn.
type Agent interface {
	// Run produces the turn's events through emit, one JSON event per call, from one
	// goroutine at a time. It returns when its stream ends, and soon after ctx is cancelled
	// or emit returns an error.
	Run(ctx context.Context, in *protocol.RunAgentInput, emit func(event []byte) error) error
}

// Sink receives a turn's events for its socket or stream, which frames them its own way.
type Sink interface {
	// Deliver queues one event: offset is where the log stored it, "" for a bare event the
	// gateway sends without storing it (RUN_ERROR log_unavailable). emitted is when the agent
	// emitted the event (for the delivery latency). It runs on the log's writer goroutine
	// (see the package doc): it must not block, and its work must be bounded.
	Deliver(offset string, event []byte, emitted time.Time)
}

// Errors returned by the emit function an Agent is given.
var (
	ErrStopped   = errors.New("turn: stopped")
	ErrViolation = errors.New("turn: protocol violation")
	ErrLimit     = errors.New("turn: limit exceeded")
)

// Terminal codes and messages of the RUN_ERROR events the turn appends itself.
const (
	CodeIncomplete     = "incomplete"
	CodeAgentError     = "agent_error"
	CodeViolation      = "protocol_violation"
	CodeAborted        = "aborted"
	CodeInterrupted    = "interrupted"
	CodeShutdown       = "shutdown"
	CodeLogUnavailable = "log_unavailable"
	CodeLimitExceeded  = "limit_exceeded"

	MsgIncomplete     = "agent stream ended without a terminal event"
	MsgAborted        = "Request aborted"
	MsgInterrupted    = "interrupted by a newer run of the thread"
	MsgShutdown       = "gateway shutting down"
	MsgLogUnavailable = "run log unavailable"
)

// DefaultCloseTimeout bounds the final flush and close of the log.
const DefaultCloseTimeout = 10 * time.Second

// DefaultAgentStopTimeout bounds the wait for an agent to return once its context is
// cancelled (an abort, a shutdown, a limit, a log failure).
const DefaultAgentStopTimeout = 5 * time.Second

// Defaults of Limits' zero fields.
const (
	DefaultMaxEvents     = 100_000
	DefaultMaxBytes      = 64 << 20
	DefaultMaxEventBytes = 1 << 20
	DefaultIdleTimeout   = 5 * time.Minute
)

// Limits bound what the agent of one run may store in the run's log. Zero fields mean the
// defaults; negative ones are invalid. The gateway's own run.accepted marker and terminal
// events are not counted.
type Limits struct {
	// MaxEvents caps the events stored for the agent (after chunk expansion); default
	// 100000. Its name in messages is max-run-events.
	MaxEvents int
	// MaxBytes caps the bytes of those events; default 64 MiB (max-run-bytes).
	MaxBytes int64
	// MaxEventBytes caps one event as the agent emits it; default 1 MiB (max-event-bytes).
	MaxEventBytes int
	// IdleTimeout caps the time the agent may emit nothing, from its start or its last event;
	// default 5 min (agent-idle-timeout). Then the agent is cancelled and the turn ends with
	// RUN_ERROR code limit_exceeded.
	IdleTimeout time.Duration
}

// orDefaults returns l with its zero fields taken from the package defaults.
func (l Limits) orDefaults() Limits {
	return Limits{
		MaxEvents:     orDefault(l.MaxEvents, DefaultMaxEvents),
		MaxBytes:      orDefault(l.MaxBytes, DefaultMaxBytes),
		MaxEventBytes: orDefault(l.MaxEventBytes, DefaultMaxEventBytes),
		IdleTimeout:   orDefault(l.IdleTimeout, DefaultIdleTimeout),
	}
}

func orDefault[T int | int64 | time.Duration](v, def T) T {
	if v != 0 {
		return v
	}
	return def
}

// Config describes a turn. Input, Agent and Log are required.
type Config struct {
	Input        *protocol.RunAgentInput
	Agent        Agent
	Log          Log
	Thread       Thread           // nil: the run is kept in its log alone
	Sink         Sink             // nil: nothing is delivered live
	Logger       *slog.Logger     // nil: discard
	Metrics      *metrics.Metrics // nil: none
	CloseTimeout time.Duration    // bound on the final flush and close; default 10s
	// AgentStopTimeout bounds the wait for the agent to return once cancelled; default 5s.
	// An agent still running then is left behind (its emits are refused) and the turn ends
	// with the code of its stop.
	AgentStopTimeout time.Duration
	Limits           Limits // zero fields: the defaults
	// Context carries values for the agent (e.g. the client's handshake headers,
	// agent.WithClientHeader) and the turn's span, if any; its cancellation is ignored. nil:
	// none. When the span records (trace.SpanFromContext), the turn records on it its
	// outcome and code, an event when its first event after run.accepted is stored, a child
	// span of the agent's call (the agent's context carries it) and one of its appends; the
	// caller ends it. The turn's log lines are written with this context.
	Context context.Context
	// OnEnd, if set, is called once from the driver goroutine when the turn has ended and its
	// log is closed, just before Done is closed.
	OnEnd func(metrics.Outcome)
	// OnLost, if set, is called once from the driver goroutine, instead of delivering the
	// bare RUN_ERROR log_unavailable, when the turn's terminal could not be stored after its
	// marker was: its log's lease was lost (Log.Lost: another gateway took the run over, or
	// reaped it), or an append failed (this gateway cannot reach the log's stream, and the
	// run will be taken over or reaped once its lease is released or expires). Either way
	// the run's log goes on, or ends, elsewhere, and the sink's client should read it from
	// there, from the last offset it was sent.
	OnLost func()
	// Accepted is when the gateway accepted the run frame, where the agent histograms'
	// time to first token and turn duration count from. Zero: when Start was called.
	Accepted time.Time
	// Aborted starts the turn aborted (its abort arrived before its run frame): the log gets
	// run.accepted then RUN_ERROR aborted, the agent never runs, nothing is delivered live.
	Aborted bool
	// Refused, if set, is asked once the run.accepted marker is stored whether the turn is
	// refused: a Refusal ends it before the agent is called, the log getting RUN_ERROR with
	// its code and message (outcome limit_exceeded) after the marker, delivered live, so that
	// the client and the run's thread see why.
	Refused func() *Refusal
	// Queued, if set, is asked next whether the run waits behind earlier runs of its
	// thread (multitaskStrategy enqueue, THREADS.md section 6): a Queue's event is stored,
	// and the agent called once its Wait returns. A stop while the run waits ends it at once
	// (an abort takes it out of the queue, RUN_ERROR aborted); so does the log's loss.
	Queued func() *Queue
	// Used, if set, is called once from the driver when the run's terminal is stored and its
	// terminals reported a token usage, with that usage by model (the entries' "model", ""
	// for entries naming none). Only the turn that produces a run calls it: never a resume,
	// a join or a replay.
	Used func(byModel map[string]metrics.Usage)
}

// Queue is what Config.Queued answers for a run that waits behind earlier runs of its
// thread: the event stored after the run.accepted marker (run.queued), and Wait, which
// returns once the run may start, or with its context's error.
type Queue struct {
	Event *protocol.Event
	Wait  func(context.Context) error
}

// Refusal is the RUN_ERROR of a turn refused before its agent is called (Config.Refused).
type Refusal struct{ Code, Message string }

// queue returns the turn's Queue, nil when it starts at once.
func (t *Turn) queue() *Queue {
	if t.cfg.Queued == nil {
		return nil
	}
	return t.cfg.Queued()
}

// waitQueued stores the queue's event and waits for it to be stored and for the queue's
// Wait, unless the turn is stopped or its log lost first; ended reports that the turn ends,
// with its outcome, instead of starting.
func (t *Turn) waitQueued(ctx context.Context, q *Queue) (outcome metrics.Outcome, code, msg string, ended bool) {
	stored := make(chan error, 1)
	t.mu.Lock()
	t.appendLocked(q.Event, time.Now(), stored)
	t.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waited := make(chan error, 1)
	go func() { waited <- q.Wait(ctx) }()
	for _, done := range []chan error{stored, waited} {
		select {
		case err := <-done:
			if err == nil {
				continue
			}
			t.log.WarnContext(t.cfg.Context, "waiting in the thread's queue", slog.String(keyErr, err.Error()))
			outcome = metrics.OutcomeLogFailed
			if done == waited {
				waited <- nil // for the wait below
			}
		case r := <-t.stopCh:
			outcome, code, msg = stopOutcome(r)
		case <-t.cfg.Log.Lost():
			outcome = metrics.OutcomeLogFailed
		}
		cancel()
		<-waited
		t.stopEmits()
		return outcome, code, msg, true
	}
	return "", "", "", false
}

// refusal returns the turn's Refusal, nil when it is not refused.
func (t *Turn) refusal() *Refusal {
	if t.cfg.Refused == nil {
		return nil
	}
	return t.cfg.Refused()
}

// ErrConfig reports a Config without Input, Agent or Log, or with negative limits.
var ErrConfig = errors.New("turn: invalid config")

// stop reasons, in the order they win when they race.
type stopReason int

const (
	stopNone stopReason = iota
	stopAbort
	stopInterrupt
	stopShutdown
)

// Turn is one running turn. Its methods are safe for concurrent use.
type Turn struct {
	cfg    Config
	log    *slog.Logger
	stopCh chan stopReason // buffered 1: the first stop request wins
	failCh chan error      // buffered 1: the first log failure
	// lastEmit is when the agent last emitted (nanoseconds since born), for the idle timer:
	// the timer reads it when it fires instead of being reset by every emit.
	lastEmit atomic.Int64
	born     time.Time
	done     chan struct{}
	// agentCtx is the agent's context, set before the agent starts: it ends an emit waiting
	// for room in the log.
	agentCtx context.Context
	// begun is set by the driver once the marker is stored (the driver's alone).
	begun bool

	sinkMu sync.Mutex
	sink   Sink

	mu        sync.Mutex // guards the pipeline and what follows
	pipe      *protocol.Pipeline
	stopped   bool               // emit refuses events
	violation error              // the verifier's refusal
	limit     error              // the limit the agent's output exceeded
	events    int                // events stored for the agent
	bytes     int64              // their bytes
	lastType  protocol.EventType // of the last event appended
	appended  bool               // an event was appended: the marker
	pending   sync.WaitGroup

	outcome metrics.Outcome // written by the driver before done closes

	tr *turnTrace // nil unless the span of cfg.Context records (trace.go)

	// What the agent histograms measure, written by stored callbacks under latMu; exemplar is
	// set by the driver before the agent starts.
	latMu      sync.Mutex
	exemplar   prometheus.Labels
	deltas     int
	firstDelta time.Time
	lastDelta  time.Time
	maxGap     time.Duration            // the slowest gap between two deltas so far
	usage      metrics.Usage            // of the terminals stored
	byModel    map[string]metrics.Usage // the same by model, for Config.Used
}

// Start validates cfg and starts the turn. The turn owns cfg.Log from here on.
func Start(cfg Config) (*Turn, error) {
	if cfg.Input == nil || cfg.Agent == nil || cfg.Log == nil {
		return nil, ErrConfig
	}
	if l := cfg.Limits; l.MaxEvents < 0 || l.MaxBytes < 0 || l.MaxEventBytes < 0 || l.IdleTimeout < 0 {
		return nil, fmt.Errorf("%w: negative limit", ErrConfig)
	}
	cfg.Limits = cfg.Limits.orDefaults()
	if cfg.Context == nil {
		cfg.Context = context.Background()
	}
	if cfg.Accepted.IsZero() {
		cfg.Accepted = time.Now()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.CloseTimeout <= 0 {
		cfg.CloseTimeout = DefaultCloseTimeout
	}
	if cfg.AgentStopTimeout <= 0 {
		cfg.AgentStopTimeout = DefaultAgentStopTimeout
	}
	t := &Turn{
		cfg:    cfg,
		log:    cfg.Logger,
		stopCh: make(chan stopReason, 1),
		failCh: make(chan error, 1),
		born:   time.Now(),
		done:   make(chan struct{}),
		sink:   cfg.Sink,
		pipe:   protocol.NewPipeline(protocol.PipelineOptions{Upgrade: true}),
		tr:     newTurnTrace(trace.SpanFromContext(cfg.Context)),
	}
	cfg.Metrics.TurnStarted()
	if cfg.Aborted {
		// Before the driver starts, so that the stop wins over starting the agent.
		t.Abort()
	}
	go t.drive()
	return t, nil
}

// RunID returns the turn's runId.
func (t *Turn) RunID() string { return t.cfg.Input.RunID }

// Abort stops the turn: the agent is cancelled, RUN_ERROR "Request aborted" (code aborted)
// is appended and the log closed. Nothing more is delivered live. It does not wait (see
// Done) and is idempotent; it has no effect once the agent's stream ended.
func (t *Turn) Abort() {
	t.Detach()
	t.requestStop(stopAbort)
}

// Interrupt stops the turn like Abort, with code interrupted (a newer run of its thread
// takes its place: multitaskStrategy interrupt), and keeps live delivery.
func (t *Turn) Interrupt() { t.requestStop(stopInterrupt) }

// Shutdown stops the turn like Abort, with code shutdown, and keeps live delivery.
func (t *Turn) Shutdown() { t.requestStop(stopShutdown) }

func (t *Turn) requestStop(r stopReason) {
	select {
	case t.stopCh <- r:
	default:
	}
}

// Detach stops live delivery: the turn goes on into its log only.
func (t *Turn) Detach() {
	t.sinkMu.Lock()
	t.sink = nil
	t.sinkMu.Unlock()
}

// Done is closed when the turn has ended: its goroutines returned and its log is closed.
func (t *Turn) Done() <-chan struct{} { return t.done }

// Wait waits for the turn to end, or ctx.
func (t *Turn) Wait(ctx context.Context) error {
	select {
	case <-t.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Outcome returns how the turn ended; it is valid once Done is closed.
func (t *Turn) Outcome() metrics.Outcome {
	<-t.done
	return t.outcome
}

func (t *Turn) deliver(offset string, event []byte, emitted time.Time) {
	t.sinkMu.Lock()
	s := t.sink
	t.sinkMu.Unlock()
	if s != nil {
		s.Deliver(offset, event, emitted)
	}
}

// fail records the first log failure.
func (t *Turn) fail(err error) {
	select {
	case t.failCh <- err:
	default:
	}
}

// appendLocked hands one event to the log; its stored callback delivers the envelope. When
// stored is non-nil it receives the append's result. emitted, the moment the event was
// emitted, is a moment ago: it also stands for the moment of the append. t.mu is held.
func (t *Turn) appendLocked(ev *protocol.Event, emitted time.Time, stored chan<- error) {
	data := ev.JSON()
	t.lastType = ev.Type()
	delta := t.lastType == protocol.TextMessageContent || t.lastType == protocol.ToolCallArgs
	terminal := t.lastType.Terminal()
	// The marker is delivered once the run is in its thread too (Thread).
	var accepted <-chan struct{}
	if th := t.cfg.Thread; th != nil {
		th.Keep(data, terminal)
		if !t.appended {
			accepted = th.Accepted()
		}
	}
	t.appended = true
	t.pending.Add(1)
	done := func(offset string, err error) {
		defer t.pending.Done()
		if accepted != nil {
			<-accepted
		}
		if err != nil {
			t.fail(err)
		} else {
			t.cfg.Metrics.EventAppended(time.Since(emitted))
			if delta {
				t.deltaStored(time.Now())
			}
			if terminal {
				t.usageStored(data)
			}
			t.deliver(offset, data, emitted)
		}
		if stored != nil {
			stored <- err
		}
	}
	if t.tr != nil {
		done = t.tr.observe(ev, emitted, done)
	}
	t.cfg.Log.Append(data, done)
}

// deltaStored counts a text or tool-call delta stored at now, and observes its gap to the
// previous one, with the run's exemplar when it is the run's slowest gap so far.
func (t *Turn) deltaStored(now time.Time) {
	t.latMu.Lock()
	defer t.latMu.Unlock()
	if t.deltas == 0 {
		t.firstDelta = now
	} else {
		gap, exemplar := now.Sub(t.lastDelta), prometheus.Labels(nil)
		if t.deltas == 1 || gap > t.maxGap {
			t.maxGap, exemplar = gap, t.exemplar
		}
		t.cfg.Metrics.TokenGap(gap, exemplar)
	}
	t.deltas++
	t.lastDelta = now
}

// usageStored adds the usage of a stored terminal event (RUN_FINISHED or RUN_ERROR; a turn's
// agent loop stores several) to the run's.
func (t *Turn) usageStored(event []byte) {
	var ev struct {
		Usage []struct {
			metrics.Usage
			Model string `json:"model"`
		} `json:"usage"`
	}
	if json.Unmarshal(event, &ev) != nil {
		return
	}
	t.latMu.Lock()
	defer t.latMu.Unlock()
	for _, u := range ev.Usage {
		t.usage = t.usage.Add(u.Usage)
		if t.cfg.Used != nil {
			if t.byModel == nil {
				t.byModel = map[string]metrics.Usage{}
			}
			t.byModel[u.Model] = t.byModel[u.Model].Add(u.Usage)
		}
	}
}

// Usage returns the token usage the run's stored terminals reported; it is valid once Done
// is closed.
func (t *Turn) Usage() metrics.Usage {
	<-t.done
	t.latMu.Lock()
	defer t.latMu.Unlock()
	return t.usage
}

// measured observes the run's latencies once its terminal is stored at end.
func (t *Turn) measured(end time.Time) {
	t.latMu.Lock()
	defer t.latMu.Unlock()
	r := metrics.RunLatency{Deltas: t.deltas, Duration: end.Sub(t.cfg.Accepted), Exemplar: t.exemplar}
	if t.deltas > 0 {
		r.FirstToken = t.firstDelta.Sub(t.cfg.Accepted)
		r.Span = t.lastDelta.Sub(t.firstDelta)
	}
	t.cfg.Metrics.RunMeasured(r)
	t.cfg.Metrics.TokensUsed(t.usage)
	if t.cfg.Used != nil && t.usage != (metrics.Usage{}) {
		t.cfg.Used(t.byModel)
	}
}

// emit is the agent's emit function.
func (t *Turn) emit(data []byte) error {
	if rw, ok := t.cfg.Log.(roomWaiter); ok {
		// Waiting for the log is not the agent's silence: the idle timer counts from here.
		t.lastEmit.Store(int64(time.Since(t.born)))
		if err := rw.WaitRoom(t.agentCtx); err != nil {
			return fmt.Errorf("%w: %w", ErrStopped, err)
		}
	}
	emitted := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return ErrStopped
	}
	t.lastEmit.Store(int64(emitted.Sub(t.born)))
	if err := t.checkLimits(len(data)); err != nil {
		t.stopped = true
		t.limit = err
		return err
	}
	evs, err := t.pipe.Push(data)
	for _, ev := range evs {
		t.events++
		t.bytes += int64(len(ev.JSON()))
		t.appendLocked(ev, emitted, nil)
	}
	if err != nil {
		t.stopped = true
		t.violation = err
		return fmt.Errorf("%w: %v", ErrViolation, err)
	}
	return nil
}

// checkLimits refuses an agent event of size bytes when it is too large, or the run already
// holds its maximum of events or bytes. t.mu is held.
func (t *Turn) checkLimits(size int) error {
	l := t.cfg.Limits
	switch {
	case size > l.MaxEventBytes:
		return fmt.Errorf("%w: an event of %d bytes exceeds the limit of %d bytes per event (max-event-bytes)", ErrLimit, size, l.MaxEventBytes)
	case t.events >= l.MaxEvents:
		return fmt.Errorf("%w: the run exceeds its limit of %d events (max-run-events)", ErrLimit, l.MaxEvents)
	case t.bytes+int64(size) > l.MaxBytes:
		return fmt.Errorf("%w: the run exceeds its limit of %d bytes of events (max-run-bytes)", ErrLimit, l.MaxBytes)
	}
	return nil
}

// stopEmits makes emit refuse further events and returns the verifier's refusal, if any.
func (t *Turn) stopEmits() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	return t.violation
}

// drive is the turn's driver goroutine.
func (t *Turn) drive() {
	defer close(t.done)
	// ctx is the turn's context: the agent runs in it, and the exemplars of the run's
	// latencies take their trace_id from the span context it holds.
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.cfg.Context))
	defer cancel()
	var traceID string
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		traceID = sc.TraceID().String()
	}
	t.latMu.Lock()
	t.exemplar = metrics.Exemplar(t.cfg.Input.RunID, traceID)
	t.latMu.Unlock()

	outcome, code, msg := t.runAgent(ctx, cancel)
	terminalStored := t.appendTerminal(outcome, code, msg)
	t.pending.Wait()
	acked := time.Now()
	if len(t.failCh) > 0 {
		terminalStored = false // an append failed: every later one failed too
	}
	if terminalStored {
		t.measured(time.Now())
	}
	if !terminalStored {
		outcome = metrics.OutcomeLogFailed
		if t.begun && t.cfg.OnLost != nil {
			t.cfg.OnLost()
		} else {
			t.deliver("", protocol.AppendRunError(nil, MsgLogUnavailable, CodeLogUnavailable), time.Now())
		}
	}
	cctx, ccancel := context.WithTimeout(context.Background(), t.cfg.CloseTimeout)
	defer ccancel()
	err := t.cfg.Log.Close(cctx)
	if err != nil {
		t.log.WarnContext(t.cfg.Context, "closing run log", slog.String(keyErr, err.Error()))
	}
	if t.cfg.Thread != nil {
		t.cfg.Thread.Closed(err)
	}
	t.outcome = outcome
	if t.tr != nil {
		t.tr.end(t, outcome, acked)
	}
	t.cfg.Metrics.TurnEnded(outcome)
	t.log.DebugContext(t.cfg.Context, "turn ended", slog.String(keyOutcome, string(outcome)))
	if t.cfg.OnEnd != nil {
		t.cfg.OnEnd(outcome)
	}
}

// Attribute keys of the turn's log lines.
const (
	keyErr     = "err"
	keyCode    = "code"
	keyOutcome = "outcome"
	keyWaited  = "waited"
)

// runAgent appends the marker, runs the agent until its stream ends or the turn is stopped,
// and returns the outcome with the RUN_ERROR to append (code "" when none is needed).
func (t *Turn) runAgent(ctx context.Context, cancel context.CancelFunc) (metrics.Outcome, string, string) {
	markerStored := make(chan error, 1)
	t.mu.Lock()
	t.appendLocked(protocol.RunAccepted(), time.Now(), markerStored)
	t.mu.Unlock()
	select {
	case err := <-markerStored:
		if err != nil {
			t.stopEmits()
			t.log.WarnContext(t.cfg.Context, "appending run.accepted", slog.String(keyErr, err.Error()))
			return metrics.OutcomeLogFailed, "", ""
		}
		t.begun = true
		// A stop requested before the marker was stored wins over starting the agent.
		select {
		case r := <-t.stopCh:
			t.stopEmits()
			return stopOutcome(r)
		default:
		}
		if r := t.refusal(); r != nil {
			t.stopEmits()
			t.log.InfoContext(t.cfg.Context, "run refused", slog.String(keyCode, r.Code))
			return metrics.OutcomeLimitExceeded, r.Code, r.Message
		}
		if q := t.queue(); q != nil {
			if outcome, code, msg, ended := t.waitQueued(ctx, q); ended {
				return outcome, code, msg
			}
		}
	case r := <-t.stopCh:
		t.stopEmits()
		return stopOutcome(r)
	case <-t.cfg.Log.Lost():
		t.stopEmits()
		return metrics.OutcomeLogFailed, "", ""
	}

	agentDone := make(chan error, 1)
	t.agentCtx = ctx
	go func() {
		if t.tr == nil {
			agentDone <- t.cfg.Agent.Run(ctx, t.cfg.Input, t.emit)
			return
		}
		actx, span := t.tr.startAgent(ctx)
		err := t.cfg.Agent.Run(actx, t.cfg.Input, t.emit)
		endAgent(span, err)
		agentDone <- err
	}()
	// The agent's goroutine is joined before the driver appends the terminal, or, if it
	// ignores its context for AgentStopTimeout, left behind: emit refuses its events from
	// stopEmits on, so none can follow the terminal either way.
	stopAgent := func() error {
		violation := t.stopEmits()
		cancel()
		wait := time.NewTimer(t.cfg.AgentStopTimeout)
		defer wait.Stop()
		select {
		case <-agentDone:
		case <-wait.C:
			t.log.WarnContext(t.cfg.Context, "agent ignored its cancellation: the turn ends without it",
				slog.Duration(keyWaited, t.cfg.AgentStopTimeout))
		}
		return violation
	}
	// A silent agent (a hung upstream) would hold the turn forever: the idle timer ends the
	// turn once no event came for IdleTimeout. An emit does not touch the timer (that would
	// wake this goroutine for every event); when it fires, it waits again for what is left
	// since the last emit.
	t.lastEmit.Store(int64(time.Since(t.born)))
	idle := time.NewTimer(t.cfg.Limits.IdleTimeout)
	defer idle.Stop()
	for {
		select {
		case <-idle.C:
			if left := t.cfg.Limits.IdleTimeout - (time.Since(t.born) - time.Duration(t.lastEmit.Load())); left > 0 {
				idle.Reset(left)
				continue
			}
			stopAgent()
			msg := fmt.Sprintf("the agent emitted no event for %v (agent-idle-timeout)", t.cfg.Limits.IdleTimeout)
			t.log.InfoContext(t.cfg.Context, "agent silent", slog.String(keyErr, msg))
			return metrics.OutcomeLimitExceeded, CodeLimitExceeded, msg
		case err := <-agentDone:
			violation := t.stopEmits()
			t.mu.Lock()
			limit := t.limit
			t.mu.Unlock()
			switch {
			case violation != nil:
				t.log.InfoContext(t.cfg.Context, "agent output refused", slog.String(keyErr, violation.Error()))
				return metrics.OutcomeProtocolViolation, CodeViolation, violation.Error()
			case limit != nil:
				t.log.InfoContext(t.cfg.Context, "agent output over a limit", slog.String(keyErr, limit.Error()))
				return metrics.OutcomeLimitExceeded, CodeLimitExceeded, strings.TrimPrefix(limit.Error(), ErrLimit.Error()+": ")
			case err != nil:
				t.log.InfoContext(t.cfg.Context, "agent failed", slog.String(keyErr, err.Error()))
				return metrics.OutcomeAgentError, CodeAgentError, err.Error()
			}
			t.mu.Lock()
			terminated := t.pipe.Terminated()
			t.mu.Unlock()
			if terminated {
				return metrics.OutcomeCompleted, "", ""
			}
			return metrics.OutcomeIncomplete, CodeIncomplete, MsgIncomplete
		case r := <-t.stopCh:
			stopAgent()
			return stopOutcome(r)
		case err := <-t.failCh:
			stopAgent()
			t.fail(err) // keep it visible to appendTerminal
			t.log.WarnContext(t.cfg.Context, "run log failed", slog.String(keyErr, err.Error()))
			return metrics.OutcomeLogFailed, "", ""
		case <-t.cfg.Log.Lost():
			stopAgent()
			t.log.WarnContext(t.cfg.Context, "run log lease lost")
			return metrics.OutcomeLogFailed, "", ""
		}
	}
}

func stopOutcome(r stopReason) (metrics.Outcome, string, string) {
	switch r {
	case stopShutdown:
		return metrics.OutcomeShutdown, CodeShutdown, MsgShutdown
	case stopInterrupt:
		return metrics.OutcomeAborted, CodeInterrupted, MsgInterrupted
	}
	return metrics.OutcomeAborted, CodeAborted, MsgAborted
}

// appendTerminal appends the closing events of the outcome and reports whether the log holds
// a terminal (the one appended, or the agent's own).
func (t *Turn) appendTerminal(outcome metrics.Outcome, code, msg string) bool {
	if outcome == metrics.OutcomeLogFailed {
		return false
	}
	if code == "" {
		return true // the agent's own terminal, already appended
	}
	stored := make(chan error, 1)
	t.mu.Lock()
	if t.lastType == protocol.RunError {
		// The log already ends with a terminal, and a RUN_ERROR may not follow a RUN_ERROR.
		t.mu.Unlock()
		return true
	}
	evs := t.pipe.Fail(msg, code)
	for i, ev := range evs {
		var ch chan<- error
		if i == len(evs)-1 {
			ch = stored
		}
		t.appendLocked(ev, time.Now(), ch)
	}
	t.mu.Unlock()
	if len(evs) == 0 {
		return true
	}
	return <-stored == nil
}
