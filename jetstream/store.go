package jetstream

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	nats "github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/wsgateway/wsgateway/budget"
	"github.com/wsgateway/wsgateway/internal/bucket"
	"github.com/wsgateway/wsgateway/jetstream/lease"
)

// Errors returned by the store. Callers compare with errors.Is.
var (
	ErrForbidden     = errors.New("jetstream: run belongs to another principal")
	ErrUnknownRun    = errors.New("jetstream: unknown or expired run")
	ErrInvalidOffset = errors.New("jetstream: invalid offset")
	ErrFenced        = errors.New("jetstream: writer fenced out")
	ErrLeaseLost     = errors.New("jetstream: lease lost")
	ErrClosed        = errors.New("jetstream: closed")
	ErrEventTooLarge = errors.New("jetstream: event too large")
)

// Config configures a Store. Zero fields mean the documented defaults.
type Config struct {
	// URLs lists external NATS servers, comma-separated. Empty starts an embedded server.
	URLs string
	// CredsFile is a NATS credentials file for URLs.
	CredsFile string
	// TLSCA, TLSCert and TLSKey are PEM files: a CA to trust, and a client certificate.
	TLSCA, TLSCert, TLSKey string

	// DataDir is where the embedded server stores JetStream data (default "./data").
	DataDir string
	// ListenAddr is the embedded server's client address (default "127.0.0.1:0", a random
	// loopback port), so another process can share the server.
	ListenAddr string

	// Stream names the stream holding the runs' logs (default "WSGATEWAY_RUNS"); with
	// Streams above 1, the other streams are named Stream_1, Stream_2, ...
	Stream string
	// SubjectPrefix prefixes run subjects (default "wsgateway.run"); the subjects of stream
	// Stream_i are prefixed SubjectPrefix-i.
	SubjectPrefix string
	// Streams is how many streams new runs are spread over, by a hash of their key
	// (default 1). A run stays on the stream it was created on (its metadata records it),
	// so changing Streams between restarts loses no run.
	Streams int
	// AbortSubject carries abort requests between the stores sharing the stream (default
	// "wsgateway.abort"); it must lie outside SubjectPrefix.
	AbortSubject string
	// ThreadPrefix prefixes the subjects of thread announcements and queries (default
	// "wsgateway.thread"); it must lie outside SubjectPrefix.
	ThreadPrefix string
	// MetaBucket and LeaseBucket name the KV buckets of run metadata and producer leases
	// (defaults "wsgateway_runs" and "wsgateway_leases").
	MetaBucket, LeaseBucket string
	// Replicas of the stream and buckets (default 1).
	Replicas int

	// Retention is how long logs and metadata are kept (default 24h).
	Retention time.Duration
	// DedupWindow is the stream's duplicate window, the horizon of publish retries
	// (default 30s).
	DedupWindow time.Duration
	// PublishTimeout bounds one publish attempt (default 5s).
	PublishTimeout time.Duration
	// LeaseTTL is how long a producer's lease lasts without renewal (default 15s).
	LeaseTTL time.Duration
	// ReapInterval is how often the reaper looks for expired leases (default LeaseTTL/3).
	ReapInterval time.Duration
	// MaxTakeovers bounds the takeovers of one run (Store.OnTakeover); one whose producer
	// dies again after as many is reaped (default DefaultMaxTakeovers; negative: none).
	MaxTakeovers int
	// JoinWait is how long a "-1" Read waits for a run that has no log yet (default 2s).
	JoinWait time.Duration
	// MaxBatchBytes caps the body of one batch message (default 512 KiB, at most the
	// server's max payload less headroom for headers).
	MaxBatchBytes int

	// MaxRunBacklog bounds the bytes of one writer's events appended and not yet stored
	// (each event counted with backlogOverhead bytes of bookkeeping, and the batch being
	// published counted again for its message's body): Writer.WaitRoom waits while the
	// writer's backlog is at it (default 8 MiB).
	MaxRunBacklog int64
	// MaxBacklog bounds the same over every writer of the store (default 256 MiB):
	// WaitRoom waits while the store's backlog is at it, unless the writer's own backlog is
	// empty (so every run makes progress; the store may then exceed it by one event a run).
	MaxBacklog int64
	// Budget is the gateway's memory budget (package budget), nil for none: the backlog is
	// charged to it, and WaitRoom also waits while it has no room (half its limit), unless
	// the writer's own backlog is empty.
	Budget *budget.Budget

	// Owner names this process in run metadata and leases (default host-pid-random).
	Owner string
	// Logger receives warnings of background work (default slog.Default()).
	Logger *slog.Logger
	// Metrics receives append and reaper observations (optional).
	Metrics *Metrics
}

// Metrics are optional callbacks; the caller turns them into collectors. They run on the
// store's goroutines and must not block.
type Metrics struct {
	// RunReaped is called once per run this store's reaper closed.
	RunReaped func()
	// LivenessRenewed is called once per renewal of the store's liveness key, which stands
	// for the leases of all its writers.
	LivenessRenewed func()
}

func (c Config) withDefaults() (Config, error) {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	defd := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.DataDir, "./data")
	def(&c.ListenAddr, "127.0.0.1:0")
	def(&c.Stream, "WSGATEWAY_RUNS")
	def(&c.SubjectPrefix, "wsgateway.run")
	def(&c.AbortSubject, "wsgateway.abort")
	def(&c.ThreadPrefix, "wsgateway.thread")
	def(&c.MetaBucket, "wsgateway_runs")
	def(&c.LeaseBucket, "wsgateway_leases")
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Streams == 0 {
		c.Streams = 1
	}
	defd(&c.Retention, 24*time.Hour)
	defd(&c.DedupWindow, 30*time.Second)
	defd(&c.PublishTimeout, 5*time.Second)
	defd(&c.LeaseTTL, 15*time.Second)
	defd(&c.ReapInterval, c.LeaseTTL/3)
	defd(&c.JoinWait, 2*time.Second)
	if c.MaxBatchBytes == 0 {
		c.MaxBatchBytes = 512 << 10
	}
	if c.MaxTakeovers == 0 {
		c.MaxTakeovers = DefaultMaxTakeovers
	}
	if c.MaxRunBacklog == 0 {
		c.MaxRunBacklog = DefaultMaxRunBacklog
	}
	if c.MaxBacklog == 0 {
		c.MaxBacklog = DefaultMaxBacklog
	}
	if c.Owner == "" {
		host, _ := os.Hostname()
		c.Owner = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), randomHex(4))
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = &Metrics{}
	}
	switch {
	case c.Replicas < 1 || c.Replicas > 5:
		return c, fmt.Errorf("jetstream: replicas %d out of 1..5", c.Replicas)
	case c.Streams < 1 || c.Streams > maxStreams:
		return c, fmt.Errorf("jetstream: streams %d out of 1..%d", c.Streams, maxStreams)
	case c.Retention < 0 || c.DedupWindow < 0 || c.LeaseTTL < 0 || c.ReapInterval < 0 ||
		c.JoinWait < 0 || c.PublishTimeout < 0:
		return c, errors.New("jetstream: negative duration in config")
	case c.DedupWindow > c.Retention:
		return c, errors.New("jetstream: dedup window longer than retention")
	case c.MaxBatchBytes < 1024:
		return c, errors.New("jetstream: max batch bytes below 1 KiB")
	case c.MaxRunBacklog < 0 || c.MaxBacklog < 0:
		return c, errors.New("jetstream: negative backlog bound")
	}
	return c, nil
}

// Defaults of the backlog bounds. A run's 8 MiB holds some seconds of the fastest agent's
// output (the demo agent at full speed, token events of about 100 bytes): more would only
// buffer what JetStream cannot take. The store's 256 MiB, with the events' copies in flight
// and the sockets' queues, keeps a gateway within a 2 GiB container while JetStream is
// unreachable, whatever the number of runs.
const (
	DefaultMaxRunBacklog = 8 << 20
	DefaultMaxBacklog    = 256 << 20
)

// backlogOverhead is what one queued event costs beyond its bytes: its pending entry, its
// callback and the turn's closure.
const backlogOverhead = 256

// Log attribute keys.
const (
	keyErr    = "err"
	keyRunID  = "runId"   // a run's runId
	keyRunKey = "run_key" // a run's key: the hash of its principal and runId
)

// openAttempts bounds Open's attempts to create the stream and buckets.
const openAttempts = 4

// errCodeNoPeers is nats-server's refusal to place a replicated stream for want of peers
// ("no suitable peers for placement"): on a cluster still forming, a node not seen online yet.
const errCodeNoPeers natsjs.ErrorCode = 10005

// provisionRetryable reports whether creating a JetStream asset failed for a cause that may
// pass on a cluster that is starting or electing: a server error (500 and above: no leader
// yet, JetStream unavailable; also some final refusals, such as a change of a stream's
// storage, which then fail after the retries), errCodeNoPeers, or no answer in time. A
// request refused as bad (400) is final.
func provisionRetryable(err error) bool {
	var apiErr *natsjs.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Code >= 500 || apiErr.ErrorCode == errCodeNoPeers
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, natsjs.ErrNoStreamResponse)
}

const (
	epochMetaKey = "wsgateway_epoch"
	hdrGen       = "Wsg-Gen"
	hdrCtl       = "Wsg-Ctl"
	ctlClose     = "close" // the log is closed: readers stop here
	ctlOpen      = "open"  // a generation starts: readers skip it
	// hdrAfter is the close record's: the sequence of the log's message before it (the
	// batch that ends with the terminal, or the open record of a log without events).
	hdrAfter = "Wsg-After"
)

// Store is a connection to the run log. It is safe for concurrent use.
type Store struct {
	cfg  Config
	ns   *server.Server // the embedded server, nil in external mode
	nc   *nats.Conn
	js   natsjs.JetStream
	meta natsjs.KeyValue
	// leaseKV is the lease bucket, which the store provisions and leases keeps: the run
	// leases, the store's liveness key, the reaper's judgement.
	leaseKV natsjs.KeyValue
	leases  *lease.Keeper
	log     *slog.Logger

	ctx    context.Context // canceled by Close: aborts background work and retries
	cancel context.CancelFunc
	wg     sync.WaitGroup // background loops

	// health is since when JetStream has been answering this store's requests: the reaper
	// spares leases that expired while their producers could not renew them.
	health lease.Health

	// backlog is the bytes appended to this store's writers and not yet stored or failed
	// (Config.MaxBacklog), a share of Config.Budget; WaitRoom waits on it.
	backlog *budget.Budget

	// lnc is the connection the liveness key is renewed on (lease.Config.LiveBucket).
	lnc *nats.Conn
	// creates bounds the readers' consumer creations in flight (maxCreates).
	creates chan struct{}

	// shards are the streams run logs are on: 0 to Streams-1 from Open, others (of runs
	// created with more streams) opened when first used. Guarded by mu.
	shards map[int]*shard
	tails  map[string]*tail // the shared tails of logs, by tailKey
	// catchUps are the readers catching up on each stream, by its name (see catchup.go).
	catchUps map[string]*catchUps
	// behind counts the open Readers that have not yet read up to the log's end as it was
	// when they opened.
	behind atomic.Int64

	mu       sync.Mutex
	writers  map[*Writer]struct{}
	byKey    map[string]*Writer // the newest writer of each run key
	idleAcks []*acks            // inboxes released by writers, still subscribed (acks.release)
	toFinish []RunInfo          // runs closed for a producer that is gone, for runClosed after the reaper's pass
	// runClosed is OnRunClosed's handler, nil for none.
	runClosed func(RunInfo)
	takeover  func(Takeover) bool // OnTakeover's handler; nil: runs are reaped
	closed    bool
	once      sync.Once
	closeErr  error // of Close, set once
}

// maxCreates bounds a store's consumer creations in flight.
const maxCreates = 32

// Open connects to NATS (starting the embedded server when cfg.URLs is empty), creates or
// updates the streams and buckets, and starts the liveness renewer and the reaper.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, log: cfg.Logger, writers: map[*Writer]struct{}{}, byKey: map[string]*Writer{},
		shards: map[int]*shard{}, tails: map[string]*tail{}, catchUps: map[string]*catchUps{},
		backlog: cfg.Budget.Share(cfg.MaxBacklog), creates: make(chan struct{}, maxCreates)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	url := cfg.URLs
	opts := []nats.Option{
		nats.Name("wsgateway " + cfg.Owner),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(100 * time.Millisecond),
		nats.ReconnectJitter(50*time.Millisecond, 200*time.Millisecond),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { s.health.Failed() }),
	}
	if url == "" {
		ns, err := startEmbedded(cfg)
		if err != nil {
			return nil, fmt.Errorf("open: %w", err)
		}
		s.ns = ns
		url = ns.ClientURL()
		// The store talks to its own server in memory, without loopback TCP; the listener
		// still serves other processes.
		opts = append(opts, nats.InProcessServer(ns))
	} else {
		if cfg.CredsFile != "" {
			opts = append(opts, nats.UserCredentials(cfg.CredsFile))
		}
		if cfg.TLSCA != "" {
			opts = append(opts, nats.RootCAs(cfg.TLSCA))
		}
		if cfg.TLSCert != "" || cfg.TLSKey != "" {
			opts = append(opts, nats.ClientCert(cfg.TLSCert, cfg.TLSKey))
		}
	}
	fail := func(err error) (*Store, error) {
		s.cancel()
		if s.nc != nil {
			s.nc.Close()
		}
		if s.lnc != nil {
			s.lnc.Close()
		}
		if s.ns != nil {
			s.ns.Shutdown()
			s.ns.WaitForShutdown()
		}
		return nil, fmt.Errorf("open: %w", err)
	}
	if s.nc, err = nats.Connect(url, opts...); err != nil {
		return fail(err)
	}
	if limit := int(s.nc.MaxPayload()) - 4096; s.cfg.MaxBatchBytes > limit {
		s.cfg.MaxBatchBytes = limit
	}
	if s.js, err = natsjs.New(s.nc); err != nil {
		return fail(err)
	}
	if err := s.Provision(ctx, "the stream and buckets", s.ensure); err != nil {
		return fail(err)
	}
	s.spreadLeaders(ctx)
	// The liveness key is renewed on a connection of its own: a data connection busy with
	// appends (or far away and full) must not delay the renewals of a live store.
	if s.lnc, err = nats.Connect(url, append(opts, nats.Name("wsgateway "+cfg.Owner+" liveness"))...); err != nil {
		return fail(err)
	}
	ljs, err := natsjs.New(s.lnc)
	if err != nil {
		return fail(fmt.Errorf("liveness connection: %w", err))
	}
	// A request on a cluster still settling its routes may go unanswered: retried as the
	// stream and buckets are.
	var live natsjs.KeyValue
	if err := s.Provision(ctx, "the liveness connection's lease bucket", func(ctx context.Context) (err error) {
		live, err = ljs.KeyValue(ctx, s.cfg.LeaseBucket)
		return err
	}); err != nil {
		return fail(fmt.Errorf("liveness connection: %w", err))
	}
	s.leases = lease.New(lease.Config{
		Bucket: s.leaseKV, LiveBucket: live, Owner: cfg.Owner, LiveKey: liveKey(cfg.Owner),
		TTL: cfg.LeaseTTL, ReapInterval: cfg.ReapInterval, RequestTimeout: cfg.PublishTimeout,
		Logger: s.log, Health: &s.health, Renewed: cfg.Metrics.LivenessRenewed,
		Changed: s.leaseChanged, Claimed: s.reapRun, PassDone: s.closedQueued,
	})
	if err := s.Provision(ctx, "the liveness key", s.leases.Renew); err != nil {
		return fail(fmt.Errorf("liveness key: %w", err))
	}
	s.health.Answered()
	s.leases.Start(s.ctx)
	return s, nil
}

// startEmbedded starts a single JetStream server on cfg.ListenAddr storing under cfg.DataDir.
func startEmbedded(cfg Config) (*server.Server, error) {
	host, port, err := net.SplitHostPort(cfg.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("listen address %q: %w", cfg.ListenAddr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, fmt.Errorf("listen address %q: %w", cfg.ListenAddr, err)
	}
	if p == 0 {
		p = server.RANDOM_PORT
	}
	ns, err := server.NewServer(&server.Options{
		ServerName: "wsgateway",
		Host:       host,
		Port:       p,
		JetStream:  true,
		StoreDir:   cfg.DataDir,
		// Every open Reader holds a consumer: no cap on a stream's consumers (the
		// server's default is 1000).
		JetStreamLimits: server.JSLimitOpts{DefaultMaxConsumers: -1},
		NoSigs:          true,
		NoLog:           true,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded server: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, errors.New("embedded server: not ready")
	}
	return ns, nil
}

// ensure creates or updates the streams and the buckets, and learns the streams' epochs.
func (s *Store) ensure(ctx context.Context) error {
	for i := range s.cfg.Streams {
		s.mu.Lock()
		have := s.shards[i] != nil
		s.mu.Unlock()
		if have {
			continue
		}
		sh, err := s.ensureShard(ctx, i)
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.shards[i] = sh
		s.mu.Unlock()
	}
	var err error
	for _, b := range []struct {
		kv   *natsjs.KeyValue
		name string
		ttl  time.Duration
	}{{&s.meta, s.cfg.MetaBucket, s.cfg.Retention}, {&s.leaseKV, s.cfg.LeaseBucket, s.cfg.Retention}} {
		*b.kv, err = s.js.CreateOrUpdateKeyValue(ctx, bucket.Config(b.name, b.ttl, s.cfg.Replicas))
		if err != nil {
			return fmt.Errorf("bucket %s: %w", b.name, err)
		}
		*b.kv = s.Elected(*b.kv)
	}
	return nil
}

// Provision calls create, which creates or updates JetStream assets (streams, buckets)
// idempotently, until it succeeds: creating a replicated asset on a busy or just started
// cluster may time out or find a peer not yet online, more so when several processes start
// at once, so such failures are retried (openAttempts in all, backing off) and logged with
// what, the assets' name; others (a request refused as bad) are returned at once.
func (s *Store) Provision(ctx context.Context, what string, create func(context.Context) error) error {
	for attempt := 1; ; attempt++ {
		err := create(ctx)
		if err == nil {
			return nil
		}
		if attempt == openAttempts || !provisionRetryable(err) || ctx.Err() != nil {
			return err
		}
		s.log.Warn("jetstream: creating "+what+", retrying", keyErr, err)
		select {
		case <-time.After(time.Duration(attempt) * time.Second):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Ready reports whether NATS is connected and the stream and buckets answer.
func (s *Store) Ready(ctx context.Context) error {
	if s.isClosed() {
		return ErrClosed
	}
	if st := s.nc.Status(); st != nats.CONNECTED {
		return fmt.Errorf("ready: nats %s", st)
	}
	for i := range s.cfg.Streams {
		sh, err := s.shard(ctx, i)
		if err == nil {
			_, err = sh.stream.Info(ctx)
		}
		if err != nil {
			return fmt.Errorf("ready: stream: %w", err)
		}
	}
	for _, kv := range []natsjs.KeyValue{s.meta, s.leaseKV} {
		if _, err := kv.Status(ctx); err != nil {
			return fmt.Errorf("ready: bucket %s: %w", kv.Bucket(), err)
		}
	}
	return nil
}

// Conn is the store's NATS connection and JetStream its JetStream handle, for other services
// of the same process that keep their data beside the run logs. Close closes them.
func (s *Store) Conn() *nats.Conn { return s.nc }

// JetStream returns the store's JetStream handle (see Conn).
func (s *Store) JetStream() natsjs.JetStream { return s.js }

// ClientURL is the URL of the embedded server, or "" in external mode.
func (s *Store) ClientURL() string {
	if s.ns == nil {
		return ""
	}
	return s.ns.ClientURL()
}

// Close stops the writers still open (their pending appends fail with ErrClosed), the
// background loops, and deletes the store's liveness key, so that reapers close the logs of
// those writers at once; then it closes the connection and the embedded server. It is
// idempotent and waits. Its error is that of the key's deletion, after which the key
// expires by itself, a LeaseTTL later; every call returns it.
func (s *Store) Close() error {
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		writers := make([]*Writer, 0, len(s.writers))
		for w := range s.writers {
			writers = append(writers, w)
		}
		s.mu.Unlock()
		s.cancel()
		s.leases.Wait()
		s.wg.Wait()
		for _, w := range writers {
			w.abandon()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.leases.DeleteLive(ctx); err != nil {
			s.closeErr = fmt.Errorf("jetstream: delete the liveness key: %w", err)
		}
		s.lnc.Close()
		s.nc.Close()
		if s.ns != nil {
			s.ns.Shutdown()
			s.ns.WaitForShutdown()
		}
	})
	return s.closeErr
}

func (s *Store) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// sleep waits d or until ctx or the store is done.
func (s *Store) sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.ctx.Done():
		return ErrClosed
	}
}

// Backlog returns the bytes appended to this store's writers that are not stored yet.
func (s *Store) Backlog() int64 { return s.backlog.Used() }

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// isSubjectBusy reports JetStream's refusal of a publish expecting a subject's last sequence
// while that subject has a message in flight (in a cluster, between a message's
// acknowledgement and the end of its processing): nothing was stored, and the publish may be
// sent again.
func isSubjectBusy(err error) bool {
	var apiErr *natsjs.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == natsjs.JSErrCodeStreamWrongLastSequenceConstant
}

// DeleteRun removes the principal's run's log and metadata, if the run is of threadID (a
// runId reused by a run of another thread is left alone); a run that aged out is nothing to
// delete. It does not stop a running producer: RequestAbort does.
func (s *Store) DeleteRun(ctx context.Context, principal, threadID, runID string) error {
	info, err := s.lookup(ctx, principal, runID)
	if err != nil || info.ThreadID != threadID {
		return nil // aged out, another principal's, or the runId now names a run of another thread
	}
	sh, err := s.shard(ctx, info.Stream)
	if err == nil {
		subject, _ := sh.subject(principal, runID)
		err = sh.stream.Purge(ctx, natsjs.WithPurgeSubject(subject))
	}
	return errors.Join(err, s.meta.Purge(ctx, runKey(runID)))
}
