package jetstream

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	nats "github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/wsgateway/wsgateway/internal/bucket"
	"github.com/wsgateway/wsgateway/internal/jsonenc"
	"github.com/wsgateway/wsgateway/internal/tracing"
)

// RunState is the state of a run's log.
type RunState string

// Run states.
const (
	RunOpen   RunState = "open"
	RunClosed RunState = "closed"
)

// RunInfo is a run's metadata, kept in the metadata bucket under the run's key.
type RunInfo struct {
	Principal  string   `json:"principal"`
	RunID      string   `json:"runId"`
	ThreadID   string   `json:"threadId"`
	Owner      string   `json:"owner"`
	State      RunState `json:"state"`
	Generation uint64   `json:"generation"`
	// Stream is the index of the stream the log is on (Config.Streams), for the run's life.
	Stream  int       `json:"stream,omitempty"`
	Created time.Time `json:"created"`
	Closed  time.Time `json:"closed,omitzero"`
	// Reaped says the reaper closed the log after the producer's lease expired.
	Reaped bool `json:"reaped,omitempty"`
	// Replay says the log's open record keeps the run's input (WithInput): a store may take
	// the run over when its producer dies. Takeovers counts the times one did.
	Replay    bool `json:"replay,omitempty"`
	Takeovers int  `json:"takeovers,omitempty"`
	// TraceParent and TraceState are the W3C trace context of the run's turn (the span of
	// Create's context), empty when it was not traced: a replay on any gateway continues
	// the turn's trace.
	TraceParent string `json:"traceparent,omitempty"`
	TraceState  string `json:"tracestate,omitempty"`
}

// Writer appends to one run's log. Append and Lost are safe for concurrent use; Close is
// idempotent.
type Writer struct {
	s        *Store
	st       natsjs.Stream // the stream the log is on
	info     RunInfo
	key      string // metadata and lease key
	subject  string
	tag      string
	msgIDPre string

	acks *acks // the answers to this writer's publishes, one publish at a time

	lost     chan struct{}
	lostOnce sync.Once
	done     chan struct{} // closed when loop returns
	wake     chan struct{}

	mu       sync.Mutex
	queue    []pending
	backlog  int64 // bytes appended and not yet stored or failed (Config.MaxRunBacklog)
	closing  bool
	err      error  // sticky: every later append fails with it
	leaseRev uint64 // revision of our lease entry, set by Create
	metaRev  uint64 // revision of the metadata Create stored
	released bool   // the lease is closed, released or left to the store's Close
	closeErr error
	closed   bool

	// input is the open record's body (WithInput); takenOver says the writer took the run
	// over (Store.OnTakeover), so it finishes the run's thread after its close. Set once.
	input     []byte
	takenOver bool

	// Owned by loop until done is closed, then by Close.
	lastSeq uint64
	batches uint64
}

type pending struct {
	event  []byte
	stored func(offset string, err error)
}

// Create starts a log for (principal, runID) and returns its writer, which holds the run's
// lease until Close. The run's metadata records the span context of ctx, if valid
// (RunInfo.TraceParent). If the run exists for another principal: ErrForbidden. If it exists
// for the same principal (a resubmit), the log starts a new generation: the old events are
// no longer served, offsets of the old generation are refused as stale, and a writer still
// producing the old generation is fenced out.
func (s *Store) Create(ctx context.Context, principal, runID, threadID string, opts ...CreateOption) (*Writer, error) {
	if s.isClosed() {
		return nil, ErrClosed
	}
	var o createOptions
	for _, opt := range opts {
		opt(&o)
	}
	if len(o.input) > s.cfg.MaxBatchBytes {
		o.input = nil // too large for the open record: the run is reaped if its producer dies
	}
	key := runKey(runID)
	info := RunInfo{Principal: principal, RunID: runID, ThreadID: threadID, Owner: s.cfg.Owner, State: RunOpen,
		Generation: 1, Stream: s.place(key), Created: time.Now().UTC(), Replay: o.input != nil}
	info.TraceParent, info.TraceState = tracing.Format(trace.SpanContextFromContext(ctx))
	sh, err := s.shard(ctx, info.Stream)
	if err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	a, err := s.newAcks()
	if err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	w, opened, existed, err := s.createNew(ctx, key, info, sh, a, o.input)
	if errors.Is(err, errRunExists) {
		// The run exists (a resubmit, or another principal's), or its key is being
		// created: claim it step by step, reading it first. A resubmit keeps its stream.
		var c claim
		if c, err = s.claimRun(ctx, key, &info, 1); err == nil {
			if sh, err = s.shard(ctx, info.Stream); err == nil {
				w = s.newWriter(key, info, sh, c)
				w.acks, w.input = a, o.input
				existed = c.existed
			}
		}
	}
	if err == nil && !opened {
		err = w.openLog(ctx, existed)
	}
	if err != nil {
		a.release()
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		a.release()
		return nil, ErrClosed
	}
	s.writers[w] = struct{}{}
	old := s.byKey[key]
	s.byKey[key] = w
	s.mu.Unlock()
	if old != nil {
		old.fail(ErrFenced) // a resubmit through this store took its run
	}
	go w.loop()
	return w, nil
}

// errRunExists is createNew's answer for a run whose key holds a lease or metadata.
var errRunExists = errors.New("jetstream: run exists")

// createNew starts a new run, the common case, in two round trips: it writes the lease, then
// the metadata (generation 1), and the open record beside them, each only where none is (KV
// creates, and an open record that expects an empty subject). The lease goes first so that
// a run's metadata never exists without its lease, which the reapers watch: a store that
// dies between the two leaves a lease without metadata, which a reaper drops and a Create
// of the run waits out (claimRun), where metadata without a lease would be a run open for
// ever, which nothing reaps. When the run's key holds a lease or metadata already, it takes
// back the lease and metadata it wrote and answers errRunExists
// (it takes them back too when the open record fails unfenced, and answers that failure);
// an open record it stored stays on the caller's own subject (principal and runId) as a
// stray, which the run's next open record finds and purges. opened reports the open record
// stored; a new run whose subject holds strays gets it from openLog.
func (s *Store) createNew(ctx context.Context, key string, info RunInfo, sh *shard, a *acks, input []byte) (w *Writer, opened, existed bool, err error) {
	w = s.newWriter(key, info, sh, claim{})
	w.input = input
	w.acks = a
	var leaseErr, metaErr, openErr error
	// The open record's publish retries through an outage; a failed lease or metadata write
	// ends it at once, since the run cannot start without them.
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if w.leaseRev, leaseErr = s.leases.Create(ctx, key, info.Generation); leaseErr != nil {
			cancel()
			return
		}
		if w.metaRev, metaErr = s.meta.Create(ctx, key, info.appendJSON(nil)); metaErr != nil {
			cancel()
		}
	}()
	go func() {
		defer wg.Done()
		_, openErr = w.publish(pctx, w.input, ctlOpen)
	}()
	wg.Wait()
	if leaseErr == nil && w.metaRev != 0 {
		switch {
		case openErr == nil:
			return w, true, false, nil
		case errors.Is(openErr, ErrFenced):
			return w, false, false, nil // strays on the subject: openLog purges them
		}
	}
	// Take back what this attempt created: the run's key is someone else's, or being created,
	// or the open record failed (a lease and open metadata without it would be a run that
	// readers tail for ever and nothing closes). An open record stored all the same is a stray.
	if leaseErr == nil {
		s.leases.Drop(ctx, key, w.leaseRev)
	}
	if w.metaRev != 0 {
		s.meta.Delete(ctx, key, natsjs.LastRevision(w.metaRev))
	}
	if errors.Is(leaseErr, natsjs.ErrKeyExists) || bucket.IsWrongLastSeq(leaseErr) || errors.Is(metaErr, natsjs.ErrKeyExists) || bucket.IsWrongLastSeq(metaErr) {
		return nil, false, false, errRunExists
	}
	err = errors.Join(leaseErr, metaErr)
	if err == nil {
		err = openErr // the open record failed alone (when a write failed, it was cut short)
	}
	return nil, false, false, fmt.Errorf("create: %w", err)
}

// claim is what claimRun took: the revisions of the run's lease and metadata, and whether
// the run existed (a resubmit).
type claim struct {
	leaseRev, metaRev uint64
	existed           bool
}

// claimRun takes the run's lease and writes its metadata for a new generation (info's
// Generation and Created), unless the run is another principal's (ErrForbidden); its
// attempts start at first (0 supposes a new run, 1 reads the run first). Nothing is
// written on a run before it is known to be the caller's: the lease of a run whose metadata
// was not read is only created where none is, and the metadata only created where none is,
// or updated at the revision read.
//
// Compare-and-set conflicts with concurrent creates end within a few attempts; a lease
// without metadata may outlast them, since it can be a create's whose store died between the
// two: it holds the run until the store's liveness lapses (a LeaseTTL at most) or a reaper
// drops it, and the attempts go on until then.
func (s *Store) claimRun(ctx context.Context, key string, info *RunInfo, first int) (claim, error) {
	held := time.Now().Add(2 * s.cfg.LeaseTTL)
	for attempt := first; attempt < 10 || time.Now().Before(held); attempt++ {
		// The first attempt supposes a new run, the common case, and asks nothing: the
		// metadata's create fails if the run exists, and the next attempt reads it.
		var e natsjs.KeyValueEntry
		var old RunInfo
		if attempt > 0 {
			var err error
			if e, old, err = s.readRun(ctx, key, info.Principal); err != nil {
				return claim{}, err
			}
		}
		info.Generation = old.Generation + 1
		if e != nil {
			info.Stream = old.Stream
		}
		leaseRev, retry, err := s.takeLease(ctx, key, e, info.Generation, attempt)
		if err != nil {
			return claim{}, err
		}
		if retry {
			continue
		}
		info.Created = time.Now().UTC()
		var metaRev uint64
		if e == nil {
			metaRev, err = s.meta.Create(ctx, key, info.appendJSON(nil))
		} else {
			metaRev, err = s.meta.Update(ctx, key, info.appendJSON(nil), e.Revision())
		}
		if bucket.IsWrongLastSeq(err) || errors.Is(err, natsjs.ErrKeyExists) {
			if e == nil {
				// The lease was created over a run whose metadata exists (a closed run,
				// whose lease is gone): give it back before reading whose run it is.
				s.leases.Drop(ctx, key, leaseRev)
			}
			continue
		}
		if err != nil {
			return claim{}, fmt.Errorf("create: %w", err)
		}
		return claim{leaseRev: leaseRev, metaRev: metaRev, existed: e != nil}, nil
	}
	return claim{}, fmt.Errorf("create: the run stayed held by concurrent creates, or by a lease without metadata for %v", 2*s.cfg.LeaseTTL)
}

// readRun returns the run's metadata entry and its value (nil and the zero RunInfo when
// there is none), or ErrForbidden when the run is another principal's.
func (s *Store) readRun(ctx context.Context, key, principal string) (natsjs.KeyValueEntry, RunInfo, error) {
	var old RunInfo
	e, err := s.meta.Get(ctx, key)
	switch {
	case errors.Is(err, natsjs.ErrKeyNotFound):
		return nil, old, nil
	case err != nil:
		return nil, old, fmt.Errorf("create: %w", err)
	}
	if err := json.Unmarshal(e.Value(), &old); err != nil {
		return nil, old, fmt.Errorf("create: metadata: %w", err)
	}
	if old.Principal != principal {
		return nil, old, ErrForbidden
	}
	return e, old, nil
}

// takeLease takes the run's lease for generation gen; e is the run's metadata as read (nil
// when not read, or none). The lease is taken before the metadata names the new generation:
// a reaper that claimed the old, expired lease sees the change and backs off. Until the
// metadata shows the run as the caller's, the lease is only created where none is: a lease
// held is a live run, maybe another principal's, and is never overwritten. retry asks for
// another attempt, which reads the metadata.
func (s *Store) takeLease(ctx context.Context, key string, e natsjs.KeyValueEntry, gen uint64, attempt int) (rev uint64, retry bool, err error) {
	if e != nil {
		rev, err = s.leases.Put(ctx, key, gen)
	} else if rev, err = s.leases.Create(ctx, key, gen); errors.Is(err, natsjs.ErrKeyExists) {
		if attempt == 0 {
			return 0, true, nil // the run exists: the next attempt reads whose it is
		}
		// No metadata, yet a lease: a concurrent Create between its lease and its metadata,
		// or an expired lease whose run is gone.
		if rev, err = s.leases.TakeExpired(ctx, key, gen); err == nil && rev == 0 {
			if err := s.sleep(ctx, min(25*time.Millisecond<<min(attempt, 6), time.Second)); err != nil {
				return 0, false, fmt.Errorf("create: %w", err)
			}
			return 0, true, nil
		}
	}
	if err != nil {
		return 0, false, fmt.Errorf("create: lease: %w", err)
	}
	return rev, false, nil
}

// newWriter returns the writer of a claimed run, before its log is opened.
func (s *Store) newWriter(key string, info RunInfo, sh *shard, c claim) *Writer {
	subject, tag := sh.subject(info.Principal, info.RunID)
	return &Writer{
		s:       s,
		st:      sh.stream,
		info:    info,
		key:     key,
		subject: subject,
		tag:     tag,
		// The creation time tells this log's message ids from those of an earlier log of the
		// same run and generation (one whose metadata went first) within the dedup window.
		msgIDPre: fmt.Sprintf("%s.%d.%d.", key, info.Generation, info.Created.UnixNano()),
		lost:     make(chan struct{}),
		done:     make(chan struct{}),
		wake:     make(chan struct{}, 1),
		leaseRev: c.leaseRev,
		metaRev:  c.metaRev,
	}
}

// openLog writes the open record of the writer's generation. The open record expects an
// empty subject, and every later publish the previous one's sequence: writers of older
// generations are fenced out. A resubmit (existed) first purges the older generation's
// events; a new run's subject is empty unless events outlived their metadata (strays), which
// the open record finds and the purge then drops.
func (w *Writer) openLog(ctx context.Context, existed bool) error {
	for purged := false; ; purged = true {
		if existed || purged {
			if err := w.st.Purge(ctx, natsjs.WithPurgeSubject(w.subject)); err != nil {
				return fmt.Errorf("create: purge: %w", err)
			}
		}
		_, err := w.publish(ctx, w.input, ctlOpen)
		if err == nil {
			return nil
		}
		if !errors.Is(err, ErrFenced) || existed || purged {
			return fmt.Errorf("create: %w", err)
		}
	}
}

// Info returns the run's metadata as of Create.
func (w *Writer) Info() RunInfo { return w.info }

// Append queues one encoded event. It does not wait for the store: stored is called once the
// event is durably stored (with its offset) or failed, exactly once per event, in append
// order, from the writer's goroutine (or, after Close, from the caller's). After a failure
// every later append fails too.
func (w *Writer) Append(event []byte, stored func(offset string, err error)) {
	w.mu.Lock()
	if w.closing {
		err := w.err
		w.mu.Unlock()
		if err == nil {
			err = ErrClosed
		}
		stored("", fmt.Errorf("append: %w", err))
		return
	}
	if w.queue == nil {
		w.queue = *pendingQueues.Get().(*[]pending)
	}
	w.queue = append(w.queue, pending{event: event, stored: stored})
	n := int64(len(event) + backlogOverhead)
	w.backlog += n
	w.s.backlog.Take(n)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// WaitRoom waits while the writer's backlog (what it was given and has not stored yet) is at
// Config.MaxRunBacklog, or, while the writer's is not empty, the store's is at
// Config.MaxBacklog or Config.Budget has no room: how a producer is pushed back while
// JetStream is slow or away, or the gateway's memory is short. It returns ctx's error if ctx
// ends first, and nil at once once the writer failed or is closing (Append then fails). It
// never waits on others alone.
func (w *Writer) WaitRoom(ctx context.Context) error {
	return w.s.backlog.Wait(ctx, w.lost, func() bool {
		w.mu.Lock()
		own, done := w.backlog, w.closing || w.err != nil
		w.mu.Unlock()
		return done || own == 0 || own < w.s.cfg.MaxRunBacklog && w.s.backlog.Used() < w.s.cfg.MaxBacklog && w.s.cfg.Budget.Room()
	})
}

// settled removes events of size bytes from the backlogs, once stored or failed.
func (w *Writer) settled(size int64) {
	w.mu.Lock()
	w.backlog -= size
	w.mu.Unlock()
	w.s.backlog.Release(size)
}

// Lost is closed when the writer lost its lease or was fenced out (the reaper closed the log,
// or the run was resubmitted).
func (w *Writer) Lost() <-chan struct{} { return w.lost }

// Err returns the error that failed the writer, or nil.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *Writer) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
	if errors.Is(err, ErrFenced) || errors.Is(err, ErrLeaseLost) {
		w.lostOnce.Do(func() { close(w.lost) })
	}
}

// batchBuf is the room a batch is encoded in (its events, then its body) while it is
// published. The writers share them (batchBufs): a run's writer lives for one turn, and each
// growing its own anew cost a seventh of the bytes the gateway allocated in the throughput
// scenario (BENCHMARKS.md); a writer waiting for events holds none.
type batchBuf struct {
	events [][]byte
	body   []byte
}

var batchBufs = sync.Pool{New: func() any { return new(batchBuf) }}

// maxPooledBatch is the largest body a batchBuf goes back to batchBufs with: the few batches
// larger (a backlog published after a stall) are not kept for the common small ones.
const maxPooledBatch = 64 << 10

// pendingQueues holds the arrays of drained queues, as batchBufs the batches' room: the loop
// gives back the array of a batch that drained the queue once it is stored, and an append to
// an empty queue, of any writer, takes one.
var pendingQueues = sync.Pool{New: func() any { return new([]pending) }}

// maxPooledPending is the largest array a drained queue gives back to pendingQueues.
const maxPooledPending = 1024

// loop is the writer's goroutine: one publish in flight, carrying everything queued while
// the previous one was in flight. It returns when the writer is closing and the queue is empty.
func (w *Writer) loop() {
	defer close(w.done)
	for {
		w.mu.Lock()
		n, size := 0, 0
		for n < len(w.queue) && n < maxBatchEvents {
			next := size + len(w.queue[n].event) + binary.MaxVarintLen64
			if n > 0 && next > w.s.cfg.MaxBatchBytes {
				break
			}
			size = next
			n++
		}
		batch, drained := w.queue[:n:n], w.queue[:0]
		if w.queue = w.queue[n:]; len(w.queue) == 0 {
			w.queue = nil // the drained array goes back to pendingQueues once the batch is stored
		} else {
			drained = nil
		}
		closing, failed := w.closing, w.err
		w.mu.Unlock()
		if n == 0 {
			if closing {
				return
			}
			<-w.wake
			continue
		}
		w.store(batch, size, failed)
		clear(batch) // neither the pool nor the rest of the queue keeps a stored event
		if c := cap(drained); c > 0 && c <= maxPooledPending {
			pendingQueues.Put(&drained)
		}
	}
}

// store publishes batch, size bytes once encoded, as one message, and reports each event's
// offset or error to it; with failed set, it fails them all with it.
func (w *Writer) store(batch []pending, size int, failed error) {
	if failed == nil && size > w.s.cfg.MaxBatchBytes {
		failed = ErrEventTooLarge
		w.fail(failed)
	}
	var cost int64
	for _, p := range batch {
		cost += int64(len(p.event) + backlogOverhead)
	}
	if failed != nil {
		w.settled(cost)
		for _, p := range batch {
			p.stored("", fmt.Errorf("append: %w", failed))
		}
		return
	}
	buf := batchBufs.Get().(*batchBuf)
	for _, p := range batch {
		buf.events = append(buf.events, p.event)
	}
	buf.body = encodeBatch(buf.body[:0], buf.events)
	body := buf.body
	// The body copies the batch's events until the publish is answered: it is charged
	// to the backlogs as well, so that producers wait for it too.
	w.mu.Lock()
	w.backlog += int64(len(body))
	w.mu.Unlock()
	w.s.backlog.Take(int64(len(body)))
	cost += int64(len(body))
	seq, err := w.publish(w.s.ctx, body, "")
	clear(buf.events) // the pool keeps no event
	if buf.events = buf.events[:0]; cap(buf.body) <= maxPooledBatch {
		batchBufs.Put(buf)
	}
	w.settled(cost)
	if err != nil {
		w.fail(err)
		for _, p := range batch {
			p.stored("", fmt.Errorf("append: %w", err))
		}
		return
	}
	for i, p := range batch {
		p.stored(position{gen: w.info.Generation, seq: seq, idx: i, tag: w.tag}.String(), nil)
	}
}

// publish stores one message after w.lastSeq, retrying with the same message id until the
// dedup window would no longer catch a duplicate.
func (w *Writer) publish(ctx context.Context, body []byte, ctl string) (uint64, error) {
	w.batches++
	id := w.msgIDPre + strconv.FormatUint(w.batches, 10)
	seq, err := w.s.publishAfter(ctx, w.acks, w.st, w.subject, w.info.Generation, w.lastSeq, id, body, ctl)
	if err != nil {
		return 0, err
	}
	w.lastSeq = seq
	return seq, nil
}

// publishAfter publishes body (or the control record ctl) to subject, expecting after as the
// subject's last sequence, and returns the stored sequence. ErrFenced means another writer
// stored after `after`.
func (s *Store) publishAfter(ctx context.Context, a *acks, st natsjs.Stream, subject string, gen, after uint64, id string, body []byte, ctl string) (uint64, error) {
	msg := nats.NewMsg(subject)
	msg.Header.Set(hdrGen, strconv.FormatUint(gen, 10))
	if ctl != "" {
		msg.Header.Set(hdrCtl, ctl)
	}
	if ctl == ctlClose {
		msg.Header.Set(hdrAfter, strconv.FormatUint(after, 10))
	}
	msg.Header.Set(natsjs.MsgIDHeader, id)
	msg.Header.Set(natsjs.ExpectedLastSubjSeqHeader, strconv.FormatUint(after, 10))
	msg.Data = body
	deadline := time.Now().Add(s.cfg.DedupWindow - s.cfg.PublishTimeout)
	backoff := 50 * time.Millisecond
	busy := 0
	for attempt := 0; ; attempt++ {
		seq, err := a.publish(ctx, msg, s.cfg.PublishTimeout)
		if err == nil {
			return seq, nil
		}
		if isSubjectBusy(err) && time.Now().Before(deadline) {
			// A cluster's stream leader acknowledges a message before it clears the
			// subject's in-flight mark; a publish arriving in between is refused unstored.
			// Not a fence: try again shortly.
			if err := s.sleep(ctx, time.Millisecond<<min(busy, 6)); err != nil {
				return 0, ErrClosed
			}
			busy++
			continue
		}
		if bucket.IsWrongLastSeq(err) {
			if attempt == 0 {
				return 0, ErrFenced
			}
			// An earlier attempt may have been stored without us seeing the ack. While the
			// stream cannot say (a leader election), the question is asked again.
			seq, stored, lerr := s.storedAfter(ctx, st, subject, after, id)
			switch {
			case lerr == nil && stored:
				return seq, nil
			case lerr == nil:
				return 0, ErrFenced
			}
			err = lerr
		}
		if ctx.Err() != nil {
			return 0, ErrClosed
		}
		if !retryable(err) || time.Now().After(deadline) {
			return 0, fmt.Errorf("publish %s: %w", subject, err)
		}
		if err := s.sleep(ctx, backoff); err != nil {
			return 0, ErrClosed
		}
		backoff = min(2*backoff, time.Second)
	}
}

// errCodeMsgIDInProcess is JetStream's "duplicate message id is in process" (409): a message
// with the publish's id is proposed but not yet stored or refused.
const errCodeMsgIDInProcess natsjs.ErrorCode = 10158

// errNotApplied: a publish was refused for a wrong last sequence, yet the stream shows nothing
// after the expected one: it answered from a state older than the refusal's.
var errNotApplied = errors.New("the stream has not applied what refused the publish yet")

// storedAfter reports whether the first message of subject after sequence after carries the
// message id, and its sequence: how a retry refused for a wrong last sequence learns that an
// earlier attempt was stored after all. err is set when the stream cannot tell yet.
func (s *Store) storedAfter(ctx context.Context, st natsjs.Stream, subject string, after uint64, id string) (seq uint64, stored bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
	defer cancel()
	m, err := st.GetMsg(ctx, after+1, natsjs.WithGetMsgSubject(subject))
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return 0, false, errNotApplied
	}
	if err != nil {
		return 0, false, err
	}
	return m.Sequence, m.Header.Get(natsjs.MsgIDHeader) == id, nil
}

// retryable reports whether a publish error may be transient: a timeout, a lost connection,
// no responder, an unavailable stream (a leader election), or an earlier attempt with the
// same message id still in process (proposed by a stream leader that has not applied it, as
// on a node cut from its peers: the next attempt learns its fate), not a refusal.
func retryable(err error) bool {
	var apiErr *natsjs.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Code >= 500 || apiErr.ErrorCode == errCodeMsgIDInProcess
	}
	return !errors.Is(err, nats.ErrMaxPayload) && !errors.Is(err, nats.ErrBadSubject) &&
		!errors.Is(err, nats.ErrInvalidMsg)
}

// Close waits for pending appends, writes the close control record, marks the run closed
// and releases the lease. It is idempotent; after a failure it returns that failure and
// writes nothing but the lease's release, so that a reaper ends the log with producer_lost
// (unless the writer was fenced, and the log is already someone else's). If ctx ends first,
// the pending appends still drain in the background and the lease is released likewise.
func (w *Writer) Close(ctx context.Context) error {
	w.mu.Lock()
	if w.closed {
		err := w.closeErr
		w.mu.Unlock()
		return err
	}
	w.closed = true
	w.closing = true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	err := w.finish(ctx)
	w.mu.Lock()
	w.closeErr = err
	w.mu.Unlock()
	return err
}

func (w *Writer) finish(ctx context.Context) error {
	select {
	case <-w.done:
	case <-ctx.Done():
		// The loop keeps draining in the background (the store's Close stops it) and hands
		// the inbox back when it returns; the lease is released for a reaper to close the log.
		w.s.forget(w)
		go func() {
			<-w.done
			w.acks.release()
		}()
		return fmt.Errorf("close %s: %w", w.info.RunID, ctx.Err())
	}
	defer w.s.forget(w)
	defer w.acks.release()
	if err := w.Err(); err != nil {
		return fmt.Errorf("close %s: %w", w.info.RunID, err)
	}
	if _, err := w.publish(ctx, nil, ctlClose); err != nil {
		w.fail(err)
		return fmt.Errorf("close %s: %w", w.info.RunID, err)
	}
	info := w.info
	info.State, info.Closed = RunClosed, time.Now().UTC()
	if err := w.s.closeRun(ctx, w.key, info, w.metaRev, w.leaseRev); err != nil {
		return fmt.Errorf("close %s: %w", w.info.RunID, err)
	}
	w.mu.Lock()
	w.released = true
	w.mu.Unlock()
	if w.takenOver {
		// The run's first producer, which would have finished its thread, is gone.
		w.s.closedLater(info)
		w.s.closedQueued()
	}
	return nil
}

// closeRun records a closed log: the metadata (unless a newer generation replaced it) and
// the removal of the lease held at revision leaseRev. metaRev is the metadata's revision when
// the caller knows it (0 when not): the update then needs no read unless someone else changed
// the metadata since.
func (s *Store) closeRun(ctx context.Context, key string, info RunInfo, metaRev, leaseRev uint64) error {
	var err error
	if metaRev != 0 {
		_, err = s.meta.Update(ctx, key, info.appendJSON(nil), metaRev)
	}
	if metaRev == 0 || bucket.IsWrongLastSeq(err) {
		var e natsjs.KeyValueEntry
		e, err = s.meta.Get(ctx, key)
		if err == nil {
			var cur RunInfo
			if json.Unmarshal(e.Value(), &cur) == nil && cur.Generation == info.Generation {
				_, err = s.meta.Update(ctx, key, info.appendJSON(nil), e.Revision())
			}
		}
	}
	if err != nil && !bucket.IsWrongLastSeq(err) && !errors.Is(err, natsjs.ErrKeyNotFound) {
		return fmt.Errorf("metadata: %w", err)
	}
	if err := s.leases.Drop(ctx, key, leaseRev); err != nil {
		return fmt.Errorf("lease: %w", err)
	}
	return nil
}

// abandon stops a writer whose store is closing: pending appends fail with ErrClosed. Its
// lease is left to the store, which deletes its liveness key last: the reapers then close
// the log.
func (w *Writer) abandon() {
	w.fail(ErrClosed)
	w.mu.Lock()
	w.closing = true
	w.released = true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	<-w.done
}

// forget drops w from the store's writers. Unless w released its lease (Close closed the
// log, or the store is closing), the store releases it (marks it expired) for a reaper to
// close the log, retrying until JetStream answers.
func (s *Store) forget(w *Writer) {
	w.mu.Lock()
	released := w.released
	w.released = true
	w.mu.Unlock()
	s.mu.Lock()
	delete(s.writers, w)
	if s.byKey[w.key] == w {
		delete(s.byKey, w.key)
	}
	s.mu.Unlock()
	if !released {
		s.leases.Release(w.key, w.leaseRev)
	}
}

// appendJSON appends info's encoding, the same bytes as json.Marshal (TestRunInfoJSON): a
// run's metadata is written at its creation and at its close.
func (info RunInfo) appendJSON(b []byte) []byte {
	b = append(b, `{"principal":`...)
	b = jsonenc.String(b, info.Principal)
	b = append(b, `,"runId":`...)
	b = jsonenc.String(b, info.RunID)
	b = append(b, `,"threadId":`...)
	b = jsonenc.String(b, info.ThreadID)
	b = append(b, `,"owner":`...)
	b = jsonenc.String(b, info.Owner)
	b = append(b, `,"state":`...)
	b = jsonenc.String(b, string(info.State))
	b = append(b, `,"generation":`...)
	b = strconv.AppendUint(b, info.Generation, 10)
	if info.Stream != 0 {
		b = append(b, `,"stream":`...)
		b = strconv.AppendInt(b, int64(info.Stream), 10)
	}
	b = append(b, `,"created":`...)
	b = jsonenc.Time(b, info.Created)
	if !info.Closed.IsZero() {
		b = append(b, `,"closed":`...)
		b = jsonenc.Time(b, info.Closed)
	}
	if info.Reaped {
		b = append(b, `,"reaped":true`...)
	}
	if info.Replay {
		b = append(b, `,"replay":true`...)
	}
	if info.Takeovers != 0 {
		b = append(b, `,"takeovers":`...)
		b = strconv.AppendInt(b, int64(info.Takeovers), 10)
	}
	if info.TraceParent != "" {
		b = append(b, `,"traceparent":`...)
		b = jsonenc.String(b, info.TraceParent)
	}
	if info.TraceState != "" {
		b = append(b, `,"tracestate":`...)
		b = jsonenc.String(b, info.TraceState)
	}
	return append(b, '}')
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
