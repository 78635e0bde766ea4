// Package lease keeps the producer leases of the run log, in their KV bucket: a run's lease,
// written when its log is created; the liveness key each store renews for all its runs' leases;
// the release of a lease whose writer stopped without closing its log; and the reaper's
// judgement of which leases expired, each claimed by exactly one of the keepers that watch the
// bucket. What becomes of a claimed run (its log closed with producer_lost, or the run taken
// over) is the run log's (Config.Claimed), as is what a writer does when its lease changes
// hands (Config.Changed). The rules are those of the jetstream package's documentation,
// "Liveness costs one write per store and period" and "An outage spares live producers".
package lease

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/wsgateway/wsgateway/internal/bucket"
	"github.com/wsgateway/wsgateway/internal/jsonenc"
)

// LivePrefix begins the key of a store's liveness key in the lease bucket; run keys have no dot.
const LivePrefix = "live."

// Value is the value of a run's key in the lease bucket while its log is open, and of a
// store's liveness key.
//
// A producer's run lease is not renewed: it names the producer's liveness key (Live), which
// its store renews once per period for all its runs, so renewal traffic grows with the
// number of stores, not of runs. The run lease expires when that key does (or is gone).
// A lease without Live (a reaper's claim, a released lease) expires at Expires.
type Value struct {
	Owner   string `json:"owner"`
	Expires int64  `json:"expires"` // Unix milliseconds
	// Gen is the generation of the run the owner writes (0 in a reaper's claim).
	Gen uint64 `json:"gen,omitempty"`
	// Live is the liveness key whose expiry is this lease's.
	Live string `json:"live,omitempty"`
}

// Encode returns v's JSON, the same bytes as json.Marshal (TestValueJSON): a lease is written
// at every run's creation.
func (v Value) Encode() []byte {
	b := append(make([]byte, 0, 64), `{"owner":`...)
	b = jsonenc.String(b, v.Owner)
	b = append(b, `,"expires":`...)
	b = strconv.AppendInt(b, v.Expires, 10)
	if v.Gen != 0 {
		b = append(b, `,"gen":`...)
		b = strconv.AppendUint(b, v.Gen, 10)
	}
	if v.Live != "" {
		b = append(b, `,"live":`...)
		b = jsonenc.String(b, v.Live)
	}
	return append(b, '}')
}

// Health tells since when JetStream has answered a store's requests: 0 while it does not (a
// disconnection or a request without answer resets it). A keeper claims expired leases only
// once JetStream has answered for a whole TTL, time for every live producer to renew.
type Health struct{ since atomic.Int64 }

// Answered records that JetStream answered a request (a refusal is an answer too).
func (h *Health) Answered() { h.since.CompareAndSwap(0, time.Now().UnixMilli()) }

// Failed records that a JetStream request got no answer (a timeout, no responders, a
// disconnection).
func (h *Health) Failed() { h.since.Store(0) }

// Config configures a Keeper.
type Config struct {
	// Bucket is the lease bucket on the store's connection; LiveBucket the same bucket on a
	// connection of its own, on which the liveness key is renewed: a data connection busy
	// with appends must not delay the renewals of a live store.
	Bucket, LiveBucket natsjs.KeyValue
	// Owner names the store in its leases; LiveKey is its liveness key (LivePrefix...).
	Owner, LiveKey string
	// TTL is how long a liveness key lasts unrenewed; ReapInterval how often expiries are
	// judged; RequestTimeout bounds one request of a release.
	TTL, ReapInterval, RequestTimeout time.Duration
	Logger                            *slog.Logger
	// Health is the store's: the keeper's requests update it, and its judgement reads it.
	Health *Health
	// Renewed, if set, is called after each renewal of the liveness key.
	Renewed func()
	// Changed is called for each change of a run's lease the watcher sees: its new revision
	// and value, v nil for a deletion.
	Changed func(key string, rev uint64, v *Value)
	// Claimed is called for each expired lease this keeper claimed, with the claim's
	// revision: the run log closes the run, or takes it over. An error is logged.
	Claimed func(ctx context.Context, key string, rev uint64) error
	// PassDone is called after each pass that judged expiries, once every lease it claimed
	// was handed to Claimed.
	PassDone func()
}

// Keeper keeps one store's leases. Its methods are safe for concurrent use.
type Keeper struct {
	cfg  Config
	kick chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex
	releases map[string]uint64 // run leases to release (key: revision), see Release
}

// New returns the keeper of cfg, its loops not started (Start).
func New(cfg Config) *Keeper {
	return &Keeper{cfg: cfg, kick: make(chan struct{}, 1), releases: map[string]uint64{}}
}

// Run returns the value of a run lease this store's writer of generation gen holds. Its
// Expires is never reached: a store that does not know Live keys (an older version during a
// rolling upgrade) must not reap the run.
func (k *Keeper) Run(gen uint64) []byte {
	return Value{Owner: k.cfg.Owner, Expires: math.MaxInt64, Gen: gen, Live: k.cfg.LiveKey}.Encode()
}

// released is the value of a lease given up: expired, for a reaper to claim.
func (k *Keeper) released() []byte { return Value{Owner: k.cfg.Owner}.Encode() }

// Create creates the run lease of key for generation gen, where none is.
func (k *Keeper) Create(ctx context.Context, key string, gen uint64) (uint64, error) {
	return k.cfg.Bucket.Create(ctx, key, k.Run(gen))
}

// Put writes the run lease of key for generation gen, whatever the key held.
func (k *Keeper) Put(ctx context.Context, key string, gen uint64) (uint64, error) {
	return k.cfg.Bucket.Put(ctx, key, k.Run(gen))
}

// Move makes the lease of key, held at revision rev (a reaper's claim), this store's run
// lease for generation gen.
func (k *Keeper) Move(ctx context.Context, key string, gen, rev uint64) (uint64, error) {
	return k.cfg.Bucket.Update(ctx, key, k.Run(gen), rev)
}

// GiveBack marks the lease of key, held at revision rev, expired, for the next pass of a
// reaper; a lease changed meanwhile is left alone.
func (k *Keeper) GiveBack(ctx context.Context, key string, rev uint64) error {
	_, err := k.cfg.Bucket.Update(ctx, key, k.released(), rev)
	if err != nil && !bucket.IsWrongLastSeq(err) && !errors.Is(err, natsjs.ErrKeyNotFound) {
		return err
	}
	return nil
}

// Drop deletes the lease of key held at revision rev; a lease changed or deleted meanwhile
// is left alone.
func (k *Keeper) Drop(ctx context.Context, key string, rev uint64) error {
	err := k.cfg.Bucket.Delete(ctx, key, natsjs.LastRevision(rev))
	if err != nil && !bucket.IsWrongLastSeq(err) && !errors.Is(err, natsjs.ErrKeyNotFound) {
		return err
	}
	return nil
}

// Held reports whether the lease of key is still at revision rev.
func (k *Keeper) Held(ctx context.Context, key string, rev uint64) bool {
	e, err := k.cfg.Bucket.Get(ctx, key)
	return err == nil && e.Revision() == rev
}

// TakeExpired takes the lease of key for generation gen when it expired (its run has no
// metadata) and returns its new revision, or 0 when there is none, or it is live or changed
// meanwhile.
func (k *Keeper) TakeExpired(ctx context.Context, key string, gen uint64) (uint64, error) {
	e, err := k.cfg.Bucket.Get(ctx, key)
	if errors.Is(err, natsjs.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var v Value
	if json.Unmarshal(e.Value(), &v) == nil {
		if live, err := k.live(ctx, v); err != nil || live {
			return 0, err
		}
	}
	rev, err := k.cfg.Bucket.Update(ctx, key, k.Run(gen), e.Revision())
	if bucket.IsWrongLastSeq(err) {
		return 0, nil
	}
	return rev, err
}

// live reports whether the lease v is held: its liveness key, or its own expiry, is in the
// future.
func (k *Keeper) live(ctx context.Context, v Value) (bool, error) {
	if v.Live == "" {
		return v.Expires > time.Now().UnixMilli(), nil
	}
	e, err := k.cfg.Bucket.Get(ctx, v.Live)
	if errors.Is(err, natsjs.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	var l Value
	return json.Unmarshal(e.Value(), &l) == nil && l.Expires > time.Now().UnixMilli(), nil
}

// Release queues the lease of key, held at revision rev by a writer that stopped without
// closing its log, to be marked expired for a reaper to close the log; the renewal loop
// retries it until JetStream answers.
func (k *Keeper) Release(key string, rev uint64) {
	k.mu.Lock()
	k.releases[key] = rev
	k.mu.Unlock()
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// Renew writes the store's liveness key with a new expiry. The liveness key must exist
// before any lease names it: a reaper takes a lease whose liveness key is missing for one
// whose store is gone.
func (k *Keeper) Renew(ctx context.Context) error {
	_, err := k.cfg.LiveBucket.Put(ctx, k.cfg.LiveKey, Value{Owner: k.cfg.Owner, Expires: time.Now().Add(k.cfg.TTL).UnixMilli()}.Encode())
	if err != nil {
		k.cfg.Health.Failed()
		return err
	}
	k.cfg.Health.Answered()
	if f := k.cfg.Renewed; f != nil {
		f()
	}
	return nil
}

// Start starts the renewal of the liveness key and the reaper, until ctx ends (Wait).
func (k *Keeper) Start(ctx context.Context) {
	k.wg.Add(2)
	go k.renewLoop(ctx)
	go k.reapLoop(ctx)
}

// Wait waits for the loops Start started to return, once their ctx ended.
func (k *Keeper) Wait() { k.wg.Wait() }

// DeleteLive deletes the store's liveness key, last when the store closes: the leases its
// writers left open expire at once, for the other stores' reapers to close their logs.
func (k *Keeper) DeleteLive(ctx context.Context) error {
	return k.cfg.LiveBucket.Delete(ctx, k.cfg.LiveKey)
}

// RenewInterval is how often a store renews its liveness key of TTL ttl: a fifth of it, so
// that a store paused (a collection, a stalled connection) for up to four fifths of it loses
// nothing.
func RenewInterval(ttl time.Duration) time.Duration { return ttl / 5 }

// renewLoop renews the store's liveness key every renewInterval, and releases the leases
// Release queued, until ctx ends.
func (k *Keeper) renewLoop(ctx context.Context) {
	defer k.wg.Done()
	t := time.NewTicker(RenewInterval(k.cfg.TTL))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			rctx, cancel := context.WithTimeout(ctx, k.cfg.TTL/2)
			if err := k.Renew(rctx); err != nil && ctx.Err() == nil {
				k.cfg.Logger.Warn("jetstream: liveness key renewal failed", "err", err)
			}
			cancel()
		case <-k.kick:
		}
		k.releaseQueued(ctx)
	}
}

// releaseQueued marks expired the run leases Release queued, each at the revision its writer
// held: a lease changed meanwhile (a reaper claimed it, a resubmit took it) is no longer ours.
func (k *Keeper) releaseQueued(ctx context.Context) {
	k.mu.Lock()
	pending := maps.Clone(k.releases)
	k.mu.Unlock()
	for key, rev := range pending {
		rctx, cancel := context.WithTimeout(ctx, k.cfg.RequestTimeout)
		err := k.GiveBack(rctx, key, rev)
		cancel()
		if err != nil {
			return // JetStream does not answer: the next tick retries
		}
		k.mu.Lock()
		delete(k.releases, key)
		k.mu.Unlock()
	}
}

// seen is a lease as the watcher last saw it.
type seen struct {
	expires  int64  // Unix milliseconds
	live     string // the liveness key whose expiry counts instead, if any
	revision uint64
}

// reapLoop watches the lease bucket and judges expiries every ReapInterval until ctx ends.
// The watcher keeps every open run's lease and every store's liveness key in memory, so a
// pass costs no request unless a lease expired. It also tells Changed of every run lease's
// change.
func (k *Keeper) reapLoop(ctx context.Context) {
	defer k.wg.Done()
	t := time.NewTicker(k.cfg.ReapInterval)
	defer t.Stop()
	var watcher natsjs.KeyWatcher
	defer func() {
		if watcher != nil {
			watcher.Stop()
		}
	}()
	var updates <-chan natsjs.KeyValueEntry
	runs := map[string]seen{}
	live := map[string]seen{} // the stores' liveness keys
	ready := false            // the watcher's initial values are in
	for {
		if watcher == nil {
			w, err := k.cfg.Bucket.WatchAll(ctx)
			if err != nil && ctx.Err() == nil {
				k.cfg.Logger.Warn("jetstream: reaper: watch leases", "err", err)
			}
			if err == nil {
				watcher, updates = w, w.Updates()
				clear(runs)
				clear(live)
				ready = false
			}
		}
		select {
		case <-ctx.Done():
			return
		case e, ok := <-updates:
			switch {
			case !ok:
				watcher.Stop()
				watcher, updates = nil, nil
			case e == nil:
				ready = true
			case e.Operation() != natsjs.KeyValuePut:
				delete(runs, e.Key())
				delete(live, e.Key())
				k.cfg.Changed(e.Key(), e.Revision(), nil)
			default:
				var v Value
				json.Unmarshal(e.Value(), &v)
				if strings.HasPrefix(e.Key(), LivePrefix) {
					live[e.Key()] = seen{expires: v.Expires, revision: e.Revision()}
					if e.Key() == k.cfg.LiveKey && v.Expires == 0 {
						k.cfg.Logger.Warn("jetstream: a reaper found this store's liveness key expired: its open runs are being ended")
					}
					continue
				}
				runs[e.Key()] = seen{expires: v.Expires, live: v.Live, revision: e.Revision()}
				k.cfg.Changed(e.Key(), e.Revision(), &v)
			}
		case <-t.C:
			if ready {
				k.reap(ctx, runs, live)
			}
		}
	}
}

// reap claims the leases of open runs that expired (their producer died or was cut off) and
// hands each to Claimed. Keepers of several stores claim a run by a compare-and-set on its
// lease, so one reaps it. A lease that names a liveness key expires with it; before claiming
// such leases, a keeper declares the key's store dead by a compare-and-set on the key at the
// revision it saw expire, so that a watcher lagging behind a renewal claims nothing.
//
// A lease that expired while JetStream did not answer (NATS down, no quorum) may belong to a
// live producer that could not renew it either: the keeper claims expired leases only once
// JetStream has answered this store for a whole TTL, time for every live producer to renew.
func (k *Keeper) reap(ctx context.Context, runs, live map[string]seen) {
	now := time.Now().UnixMilli()
	settled := false
	dead := map[string]bool{} // liveness keys this pass found dead, or alive after all
	var expired []claim
	for key, l := range runs {
		expires := l.expires
		if l.live != "" {
			expires = live[l.live].expires // 0 when its store deleted it, or was declared dead
		}
		if now < expires {
			continue
		}
		if !settled {
			if !k.settled(ctx) {
				return
			}
			settled = true
		}
		if l.live != "" {
			d, ok := dead[l.live]
			if !ok {
				d = k.declareDead(ctx, l.live, live)
				dead[l.live] = d
			}
			if !d {
				continue
			}
		}
		expired = append(expired, claim{key: key, revision: l.revision})
	}
	// Claims run concurrently, a bounded number at once: the runs of a dead store all expire
	// together.
	claimed := make([]uint64, len(expired))
	var failed atomic.Bool
	var wg sync.WaitGroup
	sem := make(chan struct{}, Concurrency)
	for i, c := range expired {
		if failed.Load() || ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			rev, err := k.claim(ctx, c)
			if err != nil {
				failed.Store(true)
			}
			claimed[i] = rev
		}()
	}
	wg.Wait()
	for i, c := range expired {
		if claimed[i] != 0 {
			runs[c.key] = seen{expires: now + k.cfg.TTL.Milliseconds(), revision: claimed[i]}
		}
	}
	k.cfg.PassDone()
}

// Concurrency bounds the runs one keeper claims and hands to Claimed at once. Each is a few
// round trips (a takeover also reads its log), so a dead gateway's runs are taken over at a
// rate that this sets: with 1,000 runs (bench/takeover), 16 took 36 s from the kill to the
// last takeover's first event, 64 took 20 s, 256 take 10 s.
const Concurrency = 256

// claim is an expired lease: its run key and the revision the watcher saw.
type claim struct {
	key      string
	revision uint64
}

// claim claims the run's expired lease by a compare-and-set at the revision seen, and hands
// it to Claimed. It returns the claim's revision (0 when the lease was renewed or claimed
// meanwhile), and an error only when JetStream does not answer.
func (k *Keeper) claim(ctx context.Context, c claim) (uint64, error) {
	v := Value{Owner: k.cfg.Owner + " reaper", Expires: time.Now().Add(k.cfg.TTL).UnixMilli()}
	rev, err := k.cfg.Bucket.Update(ctx, c.key, v.Encode(), c.revision)
	if bucket.IsWrongLastSeq(err) || errors.Is(err, natsjs.ErrKeyNotFound) {
		return 0, nil // renewed or claimed meanwhile: the watcher brings the news
	}
	if err != nil {
		k.cfg.Health.Failed()
		return 0, err
	}
	if err := k.cfg.Claimed(ctx, c.key, rev); err != nil && ctx.Err() == nil {
		k.cfg.Logger.Warn("jetstream: reap run", "run_key", c.key, "err", err)
	}
	return rev, nil
}

// declareDead reports whether the store of liveness key key is dead: its key is gone (the
// store closed), was declared dead, or is replaced now by a dead mark (expiry 0) at the
// revision this keeper saw expire. A renewal since then keeps the store alive.
func (k *Keeper) declareDead(ctx context.Context, key string, live map[string]seen) bool {
	s, ok := live[key]
	if !ok || s.expires == 0 {
		return true
	}
	rev, err := k.cfg.Bucket.Update(ctx, key, Value{Owner: k.cfg.Owner + " reaper"}.Encode(), s.revision)
	if err != nil {
		if !bucket.IsWrongLastSeq(err) && !errors.Is(err, natsjs.ErrKeyNotFound) {
			k.cfg.Health.Failed()
		}
		return false
	}
	live[key] = seen{revision: rev}
	return true
}

// settled reports whether JetStream has answered this store for at least TTL. When nothing
// tells whether it answers now, it asks (the lease bucket's status), and the TTL counts from
// that answer.
func (k *Keeper) settled(ctx context.Context) bool {
	since := k.cfg.Health.since.Load()
	if since == 0 {
		pctx, cancel := context.WithTimeout(ctx, k.cfg.RequestTimeout)
		_, err := k.cfg.Bucket.Status(pctx)
		cancel()
		if err == nil {
			k.cfg.Health.Answered()
		}
		return false
	}
	return time.Now().UnixMilli()-since >= k.cfg.TTL.Milliseconds()
}
