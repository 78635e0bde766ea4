package conversation

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/heartbeat"
	"github.com/wsgateway/wsgateway/jetstream"
	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/turn"
)

// Store is the run log store, as sockets and HTTP streams use it: *jetstream.Store. Its
// errors are jetstream's (ErrForbidden, ErrUnknownRun, ErrInvalidOffset, matched with
// errors.Is).
type Store interface {
	// Create starts (or, for the same principal, restarts) the log of runID.
	Create(ctx context.Context, principal, runID, threadID string) (*jetstream.Writer, error)
	// Read opens runID's log strictly after the offset after (a minted offset, "-1" or
	// "now").
	Read(ctx context.Context, principal, runID, after string) (*jetstream.Reader, error)
	// RequestAbort asks every gateway sharing the store to abort the principal's run;
	// OnAbort delivers those requests (this gateway's own too) for the Server's lifetime.
	RequestAbort(principal, runID, origin string) error
	OnAbort(f func(principal, runID, origin string)) error
	// ThreadKey names a principal's thread on the wire. Announce tells every gateway that a
	// run of a thread was accepted, SubscribeThread receives those announcements, and
	// QueryThread asks every gateway which runs of a thread run now, which OnThreadQuery
	// answers (the Server's registry).
	ThreadKey(principal, threadID string) string
	Announce(key string, run jetstream.Announcement) error
	SubscribeThread(key string, f func(jetstream.Announcement)) (unsubscribe func(), err error)
	QueryThread(key string, wait time.Duration, f func([]jetstream.Announcement)) (stop func(), err error)
	OnThreadQuery(running func(key string) []jetstream.Announcement) error
}

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
	DefaultPrincipal     = "anonymous"
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
)

// Config configures a Server. Store and Agent are required; zero fields mean the documented
// defaults.
type Config struct {
	Store Store
	Agent turn.Agent
	// Threads, if set, keeps every run's thread (a run frame's threadId): hydrates on the
	// HTTP transports' GET ?threadId=, and ThreadsHandler. nil: no threads (a hydrate
	// answers an empty thread).
	Threads Threads
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
	// RunFrameRate (frames per second) and RunFrameBurst fill a token bucket per
	// conversation socket that run frames take from (defaults DefaultRunFrameRate and
	// DefaultRunFrameBurst); a run frame that finds it empty is answered with a bare
	// RUN_ERROR (code limit_exceeded) and ignored. Abort frames are not counted.
	RunFrameRate  float64
	RunFrameBurst int
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

	// held counts the sockets and HTTP streams of each principal that holds any
	// (Config.MaxSocketsPerPrincipal): one entry per principal, none per socket.
	heldMu sync.Mutex
	held   map[string]int
}

// New validates cfg and returns a Server. Shutdown releases it.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil || cfg.Agent == nil {
		return nil, fmt.Errorf("%w: Store and Agent are required", ErrConfig)
	}
	if cfg.QueueSize < 0 || cfg.QueueBytes < 0 || cfg.ReadLimit < 0 || cfg.WriteTimeout < 0 || cfg.EarlyAborts < 0 ||
		cfg.EarlyAbortTTL < 0 || cfg.ResubmitWait < 0 || cfg.TurnCloseTimeout < 0 || cfg.MaxTurnsPerSocket < 0 ||
		cfg.MaxSocketsPerPrincipal < 0 || cfg.RunFrameRate < 0 || cfg.RunFrameBurst < 0 || cfg.MaxFollowsPerSocket < 0 {
		return nil, fmt.Errorf("%w: negative limit", ErrConfig)
	}
	if cfg.Tokens != nil {
		cfg.Principal = principalOf(cfg.Tokens)
	}
	if cfg.Principal == nil {
		cfg.Principal = func(*http.Request) (string, error) { return DefaultPrincipal, nil }
		cfg.MaxSocketsPerPrincipal = math.MaxInt // one principal for every client: no cap
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
		held:     make(map[string]int),
		origin:   rand.Text(),
	}
	// An abort frame on a socket of another gateway reaches the turn here, and a follower
	// there learns which runs of its thread run here.
	err = cfg.Store.OnAbort(func(principal, runID, origin string) {
		s.turns.abort(runKey{principal, runID}, nil, origin, 0, 0)
	})
	if err == nil {
		err = cfg.Store.OnThreadQuery(s.runningRuns)
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
	if kind == metrics.SocketConversation {
		c.turnCtx = s.turnContext(r)
		if !expires.IsZero() {
			c.hb.SetDeadline(expires)
		}
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

// turnContext returns the values for the agents of the turns r starts, nil for none.
func (s *Server) turnContext(r *http.Request) context.Context {
	if s.cfg.TurnContext == nil {
		return nil
	}
	return s.cfg.TurnContext(r)
}

// serve runs a socket's reader until the socket closes, then forgets the socket (ended).
// Shutdown waits for it. A conversation socket's reader goes on from goroutine to goroutine
// (serveConversation), and the last one calls ended.
func (s *Server) serve(c *conn, runID, offset string) {
	s.cfg.Metrics.SocketOpened(metrics.TransportWebSocket, c.kind())
	c.ws.SetReadLimit(s.cfg.ReadLimit)
	if c.resume {
		c.serveResume(runID, offset)
		s.ended(c)
		return
	}
	c.serveConversation()
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
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	n := s.held[principal]
	if n >= s.cfg.MaxSocketsPerPrincipal {
		return false
	}
	s.held[principal] = n + 1
	return true
}

// release forgets one socket or HTTP stream of principal; a principal that holds none has
// no entry.
func (s *Server) release(principal string) {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	if n := s.held[principal]; n > 1 {
		s.held[principal] = n - 1
	} else {
		delete(s.held, principal)
	}
}

// refuseHold answers 429 to a principal over Config.MaxSocketsPerPrincipal.
func (s *Server) refuseHold(w http.ResponseWriter, r *http.Request) {
	s.log.Debug("request refused: principal over max-principal-sockets", slog.String(keyRemote, r.RemoteAddr))
	s.cfg.Metrics.LimitRefused(metrics.LimitPrincipalSockets)
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
