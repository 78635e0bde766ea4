package conversation

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"go.opentelemetry.io/otel/trace"

	"github.com/wsgateway/wsgateway/budget"
	"github.com/wsgateway/wsgateway/heartbeat"
	"github.com/wsgateway/wsgateway/internal/quota"
	"github.com/wsgateway/wsgateway/internal/tracing"
	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/turn"
	"github.com/wsgateway/wsgateway/usage"
)

// ErrConfig reports an invalid Config.
var ErrConfig = errors.New("conversation: invalid config")

// Defaults of Config's zero fields.
const (
	DefaultQueueSize     = 16384
	DefaultQueueBytes    = 4 << 20
	DefaultReadLimit     = 1 << 20
	DefaultWriteTimeout  = 10 * time.Second
	DefaultEarlyAborts   = 64
	DefaultEarlyAbortTTL = 30 * time.Second
	DefaultResubmitWait  = 10 * time.Second
	// DefaultReplayPatience outlasts a JetStream leader election (a few seconds), during
	// which the stream of a log answers 503 "temporarily unavailable".
	DefaultReplayPatience = 10 * time.Second
	DefaultPrincipal      = "anonymous"
	// DefaultMaxTurnsPerSocket: a chat client runs one turn at a time, and a few more while
	// a regenerate or a tool round trip overlaps the previous turn.
	DefaultMaxTurnsPerSocket = 16
	// DefaultMaxSocketsPerPrincipal: a user with a conversation socket per open tab, a
	// resume socket or HTTP stream per reconnecting turn, and several devices stays far
	// below it, while one principal cannot hold thousands of sockets (each a reader
	// goroutine and its buffers).
	DefaultMaxSocketsPerPrincipal = 64
	// DefaultRunFrameRate and DefaultRunFrameBurst: a person sends a message every few
	// seconds; the burst absorbs a client that resubmits its pending turns on reconnect.
	DefaultRunFrameRate  = 10
	DefaultRunFrameBurst = 20
	// DefaultMaxFollowsPerSocket: a page follows the thread it shows, and a few more in a
	// sidebar.
	DefaultMaxFollowsPerSocket = 16
	// DefaultMaxTurnsPerPrincipal: a person has a few tabs, each running a turn or two at
	// once (a regenerate or a tool round trip overlapping the previous turn), and a few
	// scheduled turns; turns outlive their sockets and requests, so this, not the per-socket
	// cap, bounds what one principal makes the gateway run.
	DefaultMaxTurnsPerPrincipal = 32
	// DefaultTurnStartRate and DefaultTurnStartBurst: one socket alone may send
	// DefaultRunFrameRate run frames a second; the principal's bucket holds two sockets'
	// bursts (tabs resubmitting their pending turns on reconnect).
	DefaultTurnStartRate  = 10
	DefaultTurnStartBurst = 40
	// DefaultMaxHydratesPerPrincipal: a page hydrates its thread once as it loads; a few
	// tabs reloading at once stay below it.
	DefaultMaxHydratesPerPrincipal = 8
	// DefaultRefusalDelay: quota.DefaultPause.
	DefaultRefusalDelay = quota.DefaultPause
)

// Config configures a Server. Store and Agent are required; zero fields mean the documented
// defaults.
type Config struct {
	Store Store
	Agent turn.Agent
	// Replay says the agent replays a run: the same input gives the same events. Each run's
	// log then keeps its input, and a run whose gateway died is taken over by a live one,
	// which runs the agent again and appends only what follows the stored events (takeOver).
	// false: such a run ends RUN_ERROR producer_lost.
	Replay bool
	// Continue, with Replay, takes such a run over by continuing its reply instead (best
	// effort, for agents that cannot replay, as a Chat Completions server): the agent is
	// given the run's input plus the reply stored so far as the last assistant message, and
	// what it answers goes after the stored events, its own start of the run and of that
	// message left out (takeover.go, continueLog). A run whose stored reply is more than one
	// text message is ended RUN_ERROR producer_lost.
	Continue bool
	// Threads, if set, keeps every run's thread (a run frame's threadId): hydrates on the
	// HTTP transports' GET ?threadId=, and ThreadsHandler. nil: no threads (a hydrate
	// answers an empty thread).
	Threads Threads
	// AgentHistoryClient gives a run's agent the messages its run posted, and nothing else
	// (for apps that manage history themselves). false: the agent is given the thread's
	// transcript merged with them (THREADS.md section 5), when Threads is set.
	AgentHistoryClient bool
	// AgentHistoryBytes bounds the bytes of JSON of the messages an agent is given from its
	// thread: the leading system and developer messages are kept, and the newest messages
	// that fit. 0: no bound.
	AgentHistoryBytes int
	// Multitask is the multitaskStrategy of a run that names none (THREADS.md section 6),
	// while another run of its thread is active: MultitaskEnqueue (the default: it waits for
	// the earlier runs to end), MultitaskInterrupt (it interrupts the running ones and waits
	// for them to end), MultitaskReject (refused with thread_busy) or MultitaskConcurrent
	// (it starts beside them).
	Multitask string
	// Principal names the caller of a request; an error refuses the upgrade with 401. Default:
	// every request is DefaultPrincipal.
	Principal func(r *http.Request) (string, error)
	// Tokens, if set, authenticates requests in place of Principal, and a conversation
	// socket's principal then expires with its token: at the expiry the socket is closed
	// 4401 "token expired" (StatusTokenExpired) unless an auth frame brought a fresh token
	// of the same principal before; its turns go on into their logs. Resume sockets and HTTP
	// streams start no turn, and follow their run to its end past the expiry.
	Tokens Tokens
	// Heartbeat configures pings, the pong timeout and the idle timeout (package defaults).
	Heartbeat heartbeat.Config
	// QueueSize and QueueBytes cap a socket's outbound queue, in frames and bytes (defaults
	// 16384 and 4 MiB). The log acknowledges a hot turn's events in batches (group commit),
	// so a reading client must absorb a whole batch at once: the caps are sized for that,
	// not for a steady backlog.
	QueueSize  int
	QueueBytes int
	// ReadLimit caps an inbound message, in bytes (default 1 MiB); a larger one closes the
	// socket 1009.
	ReadLimit int64
	// WriteTimeout bounds the write of one batch of queued frames (default 10s); a write
	// that times out closes the socket.
	WriteTimeout time.Duration
	// EarlyAborts and EarlyAbortTTL cap the per-socket set of aborts that arrived before
	// their run frame (defaults 64 and 30s).
	EarlyAborts   int
	EarlyAbortTTL time.Duration
	// ResubmitWait bounds the wait for an aborted turn to end before its runId starts again
	// (default 10s).
	ResubmitWait time.Duration
	// ReplayPatience is how long a resume, join or HTTP replay keeps reopening a log that
	// fails to open or to read (a leader election, NATS away), from the first failure since
	// it last sent an event, before it fails (1011 "resume failed"; default 10s).
	ReplayPatience time.Duration
	// MaxTurnsPerSocket caps the turns running at once on one conversation socket (default
	// DefaultMaxTurnsPerSocket): a run frame for a new runId beyond it is answered with a
	// bare RUN_ERROR (code limit_exceeded) and creates no log; a resubmit of a running runId
	// is allowed.
	MaxTurnsPerSocket int
	// MaxSocketsPerPrincipal caps the conversation sockets, resume sockets and HTTP streams
	// one principal holds at once (default DefaultMaxSocketsPerPrincipal); beyond it a
	// request is refused with 429 before the upgrade. Without a Principal function every
	// client is DefaultPrincipal, and the cap does not apply.
	MaxSocketsPerPrincipal int
	// MaxFollowsPerSocket caps the threads one conversation socket follows (default
	// DefaultMaxFollowsPerSocket): a follow frame for another thread beyond it is answered
	// with a bare RUN_ERROR (code limit_exceeded, MsgTooManyFollows).
	MaxFollowsPerSocket int
	// MaxTurnsPerPrincipal caps the turns one principal runs at once on this Server, whatever
	// started them: run frames, HTTP POSTs, /agui, ThreadRunsHandler (default
	// DefaultMaxTurnsPerPrincipal). A turn counts from its admission (before its log is
	// created: a turn that waits to start counts) to its end; a resubmit of a running runId
	// replaces its turn and counts once. A start beyond it creates no log and is refused:
	// a bare RUN_ERROR (code limit_exceeded, MsgPrincipalTurns) on a socket, 429 over HTTP.
	MaxTurnsPerPrincipal int
	// TurnStartRate (starts per second) and TurnStartBurst fill a token bucket per principal
	// that every turn start takes from, by every door, resubmits included (defaults
	// DefaultTurnStartRate and DefaultTurnStartBurst); a start that finds it empty is refused
	// as above (MsgPrincipalTurnRate). A start refused for MaxTurnsPerPrincipal takes no token.
	TurnStartRate  float64
	TurnStartBurst int
	// MaxHydratesPerPrincipal caps the hydrates (GET ?threadId= on the HTTP transports) one
	// principal has in progress at once (default DefaultMaxHydratesPerPrincipal); beyond it,
	// 429 (MsgTooManyHydrates) before anything is read.
	MaxHydratesPerPrincipal int
	// PrincipalLimits gives named principals (a scheduler's subject) other bounds than the
	// fields above; a zero field of an entry keeps the Config's.
	PrincipalLimits map[string]PrincipalLimits
	// The per-principal bounds (MaxSocketsPerPrincipal, MaxTurnsPerPrincipal, TurnStartRate,
	// MaxHydratesPerPrincipal) hold per Server. Without a Principal function or Tokens every
	// client is DefaultPrincipal, and none of them applies.
	//
	// RunFrameRate (frames per second) and RunFrameBurst fill a token bucket per
	// conversation socket that run frames take from (defaults DefaultRunFrameRate and
	// DefaultRunFrameBurst); a run frame that finds it empty is answered with a bare
	// RUN_ERROR (code limit_exceeded) and ignored. Abort frames are not counted.
	RunFrameRate  float64
	RunFrameBurst int
	// RefusalDelay is how long a refusal by one of the bounds above waits (default
	// DefaultRefusalDelay; negative: none): a 429 is answered after it, and a socket whose
	// frame was refused reads its next frame after it (quota.Pause). A client over its
	// bounds that goes on asking is slowed to one refusal per RefusalDelay per connection.
	// The memory budget's refusals are not delayed: they are the gateway's, not the client's.
	RefusalDelay time.Duration
	// TurnCloseTimeout bounds a turn's final flush and close (turn.DefaultCloseTimeout).
	TurnCloseTimeout time.Duration
	// TurnLimits bound what every turn may store in its log (zero fields: turn's defaults).
	TurnLimits turn.Limits
	// TurnContext, if set, returns the values handed to the agent of every turn that the
	// request starts (e.g. agent.WithClientHeader with the handshake's headers); it is
	// called once per conversation socket or HTTP turn, and its cancellation is ignored.
	TurnContext func(r *http.Request) context.Context
	// AbortOnDisconnect aborts a conversation socket's turns when the socket closes, as
	// @tanstack/ai's own server does. By default turns outlive their socket (PROTOCOL.md
	// section 2, step 7).
	AbortOnDisconnect bool
	// TracerProvider, if set, traces turns and replays (docs/CONFIGURATION.md, "Tracing"): a span per turn,
	// a child of the W3C trace context of its run frame's forwardedProps (traceparent,
	// tracestate) or else of its request's headers, kept in the run's metadata, so that a
	// replay on any gateway is a span of the same trace, linked to the turn. nil: no
	// tracing, at no cost.
	TracerProvider trace.TracerProvider
	// Budget is the gateway's memory budget (package budget), nil for none. Frames queued
	// to sockets and HTTP streams, and the logs a hydrate reads, are charged to it. While it
	// admits no new work (three quarters of its limit), a new turn is refused with a bare
	// RUN_ERROR (code limit_exceeded, MsgMemoryBudget) before its log is created, and a
	// hydrate with 503; while it has no room (half), replays wait; at its limit, a frame for
	// a socket or stream already behind does not fit (a slow consumer: closed 1013, or
	// continued from the log).
	Budget *budget.Budget
	// Usage, if set, is the usage ledger (package usage): every run's token usage is
	// recorded there once its terminal is stored (by this Server, the run's producer), GET
	// /api/usage (UsageHandler) reads it, and a turn whose principal has used its token
	// budget of the period ends RUN_ERROR code budget_exceeded (CodeBudgetExceeded) before
	// its agent is called. nil: no ledger, no budget.
	Usage *usage.Ledger
	// OriginPatterns lists the browser origins allowed besides the request's own host
	// (websocket.AcceptOptions.OriginPatterns).
	OriginPatterns []string
	Logger         *slog.Logger     // default: discard
	Metrics        *metrics.Metrics // default: none
}

// Server serves GET /ws. It is safe for concurrent use.
type Server struct {
	cfg    Config
	log    *slog.Logger
	tracer trace.Tracer // nil: no tracing
	wheel  *heartbeat.Wheel
	accept websocket.AcceptOptions

	// ctx is cancelled when Shutdown gives up waiting: it bounds log creation and resubmits.
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	closing  bool
	conns    map[*conn]struct{}
	streams  map[*httpStream]struct{}
	connWG   sync.WaitGroup // socket and HTTP handlers
	shutOnce sync.Once
	shutDone chan struct{}

	turns registry // every turn, from its run frame to its end
	hub   hub      // the threads its sockets follow

	// origin names this Server in announcements, connIDs its sockets (conn.origin).
	origin  string
	connIDs atomic.Uint64

	// The per-principal counts: sockets and HTTP streams (Config.MaxSocketsPerPrincipal),
	// hydrates in progress (Config.MaxHydratesPerPrincipal); an entry per principal that holds
	// any, none per socket. The registry counts turns.
	sockets  quota.Counts
	hydrates quota.Counts
	// settled holds, by runKey, the events of this gateway's runs whose terminal was
	// appended and whose thread is not finished yet ([]json.RawMessage): the next run of
	// the thread takes its context from them without reading the log back
	// (earlierRuns).
	settled sync.Map
}

// New validates cfg and returns a Server. Shutdown releases it.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil || cfg.Agent == nil {
		return nil, fmt.Errorf("%w: Store and Agent are required", ErrConfig)
	}
	if cfg.QueueSize < 0 || cfg.QueueBytes < 0 || cfg.ReadLimit < 0 || cfg.WriteTimeout < 0 || cfg.EarlyAborts < 0 ||
		cfg.EarlyAbortTTL < 0 || cfg.ResubmitWait < 0 || cfg.ReplayPatience < 0 || cfg.TurnCloseTimeout < 0 || cfg.MaxTurnsPerSocket < 0 ||
		cfg.MaxSocketsPerPrincipal < 0 || cfg.RunFrameRate < 0 || cfg.RunFrameBurst < 0 || cfg.MaxFollowsPerSocket < 0 ||
		cfg.MaxTurnsPerPrincipal < 0 || cfg.TurnStartRate < 0 || cfg.TurnStartBurst < 0 || cfg.MaxHydratesPerPrincipal < 0 ||
		cfg.AgentHistoryBytes < 0 {
		return nil, fmt.Errorf("%w: negative limit", ErrConfig)
	}
	if cfg.Multitask != "" && !slices.Contains(protocol.MultitaskStrategies, cfg.Multitask) {
		return nil, fmt.Errorf("%w: Multitask %q: want one of %s", ErrConfig, cfg.Multitask, strings.Join(protocol.MultitaskStrategies, ", "))
	}
	if cfg.Tokens != nil {
		cfg.Principal = principalOf(cfg.Tokens)
	}
	bounded := cfg.Principal != nil
	if !bounded {
		cfg.Principal = func(*http.Request) (string, error) { return DefaultPrincipal, nil }
		// One principal for every client: no per-principal bound.
		cfg.MaxSocketsPerPrincipal, cfg.MaxTurnsPerPrincipal, cfg.MaxHydratesPerPrincipal = math.MaxInt, math.MaxInt, math.MaxInt
		cfg.PrincipalLimits = nil
	}
	if cfg.QueueSize == 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.QueueBytes == 0 {
		cfg.QueueBytes = DefaultQueueBytes
	}
	if cfg.ReadLimit == 0 {
		cfg.ReadLimit = DefaultReadLimit
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.EarlyAborts == 0 {
		cfg.EarlyAborts = DefaultEarlyAborts
	}
	if cfg.EarlyAbortTTL == 0 {
		cfg.EarlyAbortTTL = DefaultEarlyAbortTTL
	}
	if cfg.ResubmitWait == 0 {
		cfg.ResubmitWait = DefaultResubmitWait
	}
	if cfg.ReplayPatience == 0 {
		cfg.ReplayPatience = DefaultReplayPatience
	}
	if cfg.MaxTurnsPerSocket == 0 {
		cfg.MaxTurnsPerSocket = DefaultMaxTurnsPerSocket
	}
	if cfg.MaxFollowsPerSocket == 0 {
		cfg.MaxFollowsPerSocket = DefaultMaxFollowsPerSocket
	}
	if cfg.MaxSocketsPerPrincipal == 0 {
		cfg.MaxSocketsPerPrincipal = DefaultMaxSocketsPerPrincipal
	}
	if cfg.RunFrameRate == 0 {
		cfg.RunFrameRate = DefaultRunFrameRate
	}
	if cfg.RunFrameBurst == 0 {
		cfg.RunFrameBurst = DefaultRunFrameBurst
	}
	if cfg.MaxTurnsPerPrincipal == 0 {
		cfg.MaxTurnsPerPrincipal = DefaultMaxTurnsPerPrincipal
	}
	if cfg.TurnStartRate == 0 {
		cfg.TurnStartRate = DefaultTurnStartRate
	}
	if cfg.TurnStartBurst == 0 {
		cfg.TurnStartBurst = DefaultTurnStartBurst
	}
	if cfg.RefusalDelay == 0 {
		cfg.RefusalDelay = DefaultRefusalDelay
	}
	if cfg.MaxHydratesPerPrincipal == 0 {
		cfg.MaxHydratesPerPrincipal = DefaultMaxHydratesPerPrincipal
	}
	for p, l := range cfg.PrincipalLimits {
		if l.Sockets < 0 || l.Turns < 0 || l.TurnRate < 0 || l.TurnBurst < 0 || l.Hydrates < 0 {
			return nil, fmt.Errorf("%w: negative limit for principal %q", ErrConfig, p)
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	wheel, err := heartbeat.New(cfg.Heartbeat)
	if err != nil {
		return nil, fmt.Errorf("conversation: %w", err)
	}
	cfg.Heartbeat = wheel.Config()
	accept := websocket.AcceptOptions{OriginPatterns: cfg.OriginPatterns}
	parkOptions(&accept)
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg:      cfg,
		log:      cfg.Logger,
		wheel:    wheel,
		accept:   accept,
		ctx:      ctx,
		cancel:   cancel,
		conns:    make(map[*conn]struct{}),
		streams:  make(map[*httpStream]struct{}),
		shutDone: make(chan struct{}),
		origin:   rand.Text(),
	}
	if cfg.TracerProvider != nil {
		s.tracer = cfg.TracerProvider.Tracer(tracing.Scope)
	}
	if bounded {
		s.turns.limits = s.limits
	}
	// An abort frame on a socket of another gateway reaches the turn here, and a follower
	// there learns which runs of its thread run here.
	err = cfg.Store.OnAbort(func(principal, runID, origin string, interrupt bool) {
		if interrupt {
			s.turns.interrupt(runKey{principal, runID})
			return
		}
		s.turns.abort(runKey{principal, runID}, nil, origin, 0, 0)
	})
	if err == nil {
		err = cfg.Store.OnThreadQuery(s.runningRuns)
	}
	if err == nil && cfg.Replay {
		cfg.Store.OnTakeover(s.takeOver)
	}
	if err != nil {
		cancel()
		wheel.Close()
		return nil, fmt.Errorf("conversation: %w", err)
	}
	return s, nil
}

// Attribute keys of log lines.
const (
	keyKind   = "kind"
	keyRunID  = "runId"
	keyRemote = "remote"
	keyErr    = "err"
	keyCode   = "code"
	keyReason = "reason"
	keyQueued = "queued"
	keyBytes  = "bytes"
)

// ServeHTTP upgrades the request to a WebSocket: a conversation socket without an offset
// query parameter, a resume socket with one. It returns once the socket is handed to its
// reader goroutine, which the Server owns (Shutdown closes the socket and waits for it). It
// refuses with 503 once Shutdown has begun, with 401 when Config.Principal fails, and with
// 429 when the principal holds Config.MaxSocketsPerPrincipal sockets and streams.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	principal, expires, err := s.identify(r)
	if err != nil {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	if !s.hold(principal) {
		s.refuseHold(w, r)
		return
	}
	q := r.URL.Query()
	kind := metrics.SocketConversation
	if q.Has("offset") {
		kind = metrics.SocketResume
	}
	if !s.beginConn() {
		s.release(principal)
		http.Error(w, "service restart", http.StatusServiceUnavailable)
		return
	}
	hj := &batchHijacker{ResponseWriter: w, writeTimeout: s.cfg.WriteTimeout}
	ws, err := websocket.Accept(hj, r, &s.accept)
	if err != nil {
		s.release(principal)
		s.connWG.Done()
		return // Accept answered the request
	}
	c := newConn(s, ws, hj.conn, kind, principal, r.RemoteAddr)
	if kind == metrics.SocketResume {
		c.turnCtx = s.withRemoteParent(context.Background(), r.Header)
	}
	if kind == metrics.SocketConversation {
		c.turnCtx = s.turnContext(r)
		if !expires.IsZero() {
			c.hb.SetDeadline(expires)
		}
	} else {
		c.expires = expires
	}
	s.mu.Lock()
	closing := s.closing
	if !closing {
		s.conns[c] = struct{}{}
	}
	s.mu.Unlock()
	if closing {
		c.requestClose(websocket.StatusServiceRestart, "service restart", false)
	}
	// The socket's reader is a goroutine of its own, so that net/http's goroutine returns and
	// frees its grown stack, the request and the response buffers of the handshake.
	go s.serve(c, q.Get("runId"), q.Get("offset"))
}

// turnContext returns the values for the agents of the turns r starts, with the trace
// context of r's headers (withRemoteParent); nil for none.
func (s *Server) turnContext(r *http.Request) context.Context {
	var ctx context.Context
	if s.cfg.TurnContext != nil {
		ctx = s.cfg.TurnContext(r)
	}
	return s.withRemoteParent(ctx, r.Header)
}

// serve runs a socket's reader until the socket closes, then forgets the socket (ended).
// Shutdown waits for it. A conversation socket's reader goes on from goroutine to goroutine
// (serveConversation), parked in the poller between frames where it can be, and the last
// one calls ended.
func (s *Server) serve(c *conn, runID, offset string) {
	s.cfg.Metrics.SocketOpened(metrics.TransportWebSocket, c.kind())
	c.ws.SetReadLimit(-1) // the reader applies Config.ReadLimit (conn.read)
	if c.resume {
		c.serveResume(runID, offset)
		s.ended(c)
		return
	}
	if !c.park() {
		c.serveConversation()
	}
}

// ended forgets a socket whose reader stopped; it is the reader's last step.
func (s *Server) ended(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.release(c.principal)
	s.cfg.Metrics.SocketClosed(metrics.TransportWebSocket, c.kind())
	s.connWG.Done()
}

// MsgTooManySockets is the body of the 429 answer to a principal over
// Config.MaxSocketsPerPrincipal.
const MsgTooManySockets = "too many sockets for this principal (max-principal-sockets)"

// hold counts one more socket or HTTP stream of principal, unless it holds
// Config.MaxSocketsPerPrincipal already. release undoes it.
func (s *Server) hold(principal string) bool {
	return s.sockets.Take(principal, s.limits(principal).Sockets)
}

// release forgets one socket or HTTP stream of principal.
func (s *Server) release(principal string) { s.sockets.Put(principal) }

// refuseHold answers 429 to a principal over Config.MaxSocketsPerPrincipal, after
// Config.RefusalDelay.
func (s *Server) refuseHold(w http.ResponseWriter, r *http.Request) {
	s.log.Debug("request refused: principal over max-principal-sockets", slog.String(keyRemote, r.RemoteAddr))
	s.cfg.Metrics.LimitRefused(metrics.LimitPrincipalSockets)
	quota.Pause(r.Context(), s.cfg.RefusalDelay)
	http.Error(w, MsgTooManySockets, http.StatusTooManyRequests)
}

// Shutdown closes every socket 1012 "service restart" and refuses new ones, waits for running
// turns to finish into their logs until ctx is done, then stops the rest (RUN_ERROR code
// shutdown) and waits for them to close their logs. It returns once every socket handler and
// turn has returned, with ctx's error if turns had to be stopped. It is idempotent; later
// calls wait for the first.
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	s.shutOnce.Do(func() {
		defer close(s.shutDone)
		s.turns.close()
		s.mu.Lock()
		s.closing = true
		conns := make([]*conn, 0, len(s.conns))
		for c := range s.conns {
			conns = append(conns, c)
		}
		streams := make([]*httpStream, 0, len(s.streams))
		for st := range s.streams {
			streams = append(streams, st)
		}
		s.mu.Unlock()
		for _, c := range conns {
			c.requestClose(websocket.StatusServiceRestart, "service restart", false)
		}
		for _, st := range streams {
			st.shutdown()
		}
		if !waitCtx(ctx, &s.turns.wg) {
			err = ctx.Err()
			s.cancel() // log creations and resubmit waits end at once
			s.turns.stop()
			s.turns.wg.Wait()
		}
		s.connWG.Wait()
		s.cancel()
		s.wheel.Close()
	})
	<-s.shutDone
	return err
}

// waitCtx waits for wg or ctx and reports whether wg finished. The goroutine it starts ends
// when wg does; callers wait for wg afterwards in every case.
func waitCtx(ctx context.Context, wg *sync.WaitGroup) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// beginConn registers a socket or HTTP handler; it fails once Shutdown has begun.
func (s *Server) beginConn() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.connWG.Add(1)
	return true
}
