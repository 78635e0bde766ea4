package threadstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	nats "github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/wsgateway/wsgateway/internal/bucket"
	"github.com/wsgateway/wsgateway/jetstream"
)

// ErrClosed is returned by a store's calls after Close.
var ErrClosed = errors.New("threadstore: closed")

// Config configures a Store. Zero fields mean the documented defaults.
type Config struct {
	// Bucket names the KV bucket of threads (default "wsgateway_threads").
	Bucket string
	// Replicas of the bucket (default 1).
	Replicas int
	// Retention is how long a thread is kept after its last update (default
	// DefaultRetention), independently of its runs' logs; every key of the bucket (heads,
	// records, segments) expires with it.
	Retention time.Duration
	// MaxThreadsPerPrincipal bounds the threads one principal has: a run that would start
	// another is refused (ErrThreadLimit). 0: no bound.
	MaxThreadsPerPrincipal int
	// PublishTimeout bounds one write or read attempt (default 5s).
	PublishTimeout time.Duration
	// Logger receives warnings of background work (default slog.Default()).
	Logger *slog.Logger
}

// DefaultRetention is how long a thread is kept after its last update by default.
const DefaultRetention = 30 * 24 * time.Hour

func (c Config) withDefaults() (Config, error) {
	if c.Bucket == "" {
		c.Bucket = "wsgateway_threads"
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case c.Replicas < 1 || c.Replicas > 5:
		return c, fmt.Errorf("threadstore: replicas %d out of 1..5", c.Replicas)
	case c.Retention < 0 || c.PublishTimeout < 0:
		return c, errors.New("threadstore: negative duration in config")
	case c.MaxThreadsPerPrincipal < 0:
		return c, errors.New("threadstore: negative max threads per principal")
	}
	return c, nil
}

// Store keeps threads in a KV bucket beside the run logs of a jetstream.Store, on its
// connection. It is safe for concurrent use.
type Store struct {
	cfg  Config
	runs *jetstream.Store
	nc   *nats.Conn
	js   natsjs.JetStream
	log  *slog.Logger
	// threads is the bucket, its reads and writes waiting out elections.
	threads jetstream.ElectedKV
	// threadStream is the bucket's stream: heads are written with headers and listed by
	// them (head.go).
	threadStream natsjs.Stream

	ctx    context.Context // canceled by Close: aborts background work and retries
	cancel context.CancelFunc
	// wg counts the background work (background): seals, purges, the threads of reaped
	// runs; closed, under mu, refuses more once Close waits for it.
	wg     sync.WaitGroup
	mu     sync.Mutex
	closed bool

	// holds are the threads this store is updating, by key (threadHold).
	holdsMu sync.Mutex
	holds   map[string]*threadHold
	// kept is what the store keeps of the thread values it wrote (keep.go).
	kept threadKeep
	// records keeps the threads' sealed records it read or wrote (log.go).
	records recordCache
	// threadBytes counts the bytes of the thread writes this store made: values, records
	// and segments (ThreadBytesWritten).
	threadBytes atomic.Int64
	// sealing counts the seals in the background (sealLater).
	sealing atomic.Int64
	// counts keeps the principals' thread counts (head.go).
	counts threadCounts
}

// Open creates or updates the threads' bucket on the run store's connection, and finishes
// the thread of every run the run store's reaper closes or takes over and closes (the run's
// first producer, which would have, is gone). Close it before runs.
func Open(ctx context.Context, runs *jetstream.Store, cfg Config) (*Store, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, runs: runs, nc: runs.Conn(), js: runs.JetStream(), log: cfg.Logger,
		holds: map[string]*threadHold{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	err = runs.Provision(ctx, "the threads' bucket", func(ctx context.Context) error {
		kv, err := s.js.CreateOrUpdateKeyValue(ctx, bucket.Config(cfg.Bucket, cfg.Retention, cfg.Replicas))
		if err != nil {
			return fmt.Errorf("bucket %s: %w", cfg.Bucket, err)
		}
		s.threads = runs.Elected(kv)
		if s.threadStream, err = s.js.Stream(ctx, "KV_"+cfg.Bucket); err != nil {
			return fmt.Errorf("bucket %s: %w", cfg.Bucket, err)
		}
		return nil
	})
	if err != nil {
		s.cancel()
		return nil, fmt.Errorf("threadstore: open: %w", err)
	}
	runs.OnRunClosed(s.finishClosed)
	return s, nil
}

// Ready reports whether the threads' bucket answers.
func (s *Store) Ready(ctx context.Context) error {
	if s.ctx.Err() != nil {
		return ErrClosed
	}
	if _, err := s.threads.Status(ctx); err != nil {
		return fmt.Errorf("ready: bucket %s: %w", s.cfg.Bucket, err)
	}
	return nil
}

// Close stops the store's background work (a seal not yet applied is left to a later finish
// of its thread) and waits for it. It is idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	return nil
}

// background runs f in a goroutine Close waits for, with a minute to do its work; what, and
// the run's id when there is one, name its failure in the log. It runs nothing, and reports
// false, once the store is closed.
func (s *Store) background(what, runID string, f func(context.Context) error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
		defer cancel()
		if err := f(ctx); err != nil && s.ctx.Err() == nil {
			if runID != "" {
				s.log.Warn("threadstore: "+what, keyRunID, runID, keyErr, err)
			} else {
				s.log.Warn("threadstore: "+what, keyErr, err)
			}
		}
	}()
	return true
}

// finishClosed finishes, in the background, the thread of a run the run store closed for a
// producer that is gone.
func (s *Store) finishClosed(info jetstream.RunInfo) {
	if info.ThreadID == "" {
		return
	}
	s.background("finishing the thread of a reaped run", info.RunID, func(ctx context.Context) error {
		return s.finishReaped(ctx, info)
	})
}

// Log attribute keys.
const (
	keyErr   = "err"
	keyRunID = "runId"
)
