package threadstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/wsgateway/wsgateway/internal/bucket"
	"github.com/wsgateway/wsgateway/jetstream"
	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/thread"
)

// ErrUnknownThread reports a thread that does not exist for the principal (never created,
// expired, deleted, or another principal's).
var ErrUnknownThread = errors.New("jetstream: unknown thread")

// ErrThreadLimit refuses a run that would start a thread beyond the principal's
// Config.MaxThreadsPerPrincipal.
var ErrThreadLimit = errors.New("jetstream: the principal has as many threads as it may")

// ErrThreadBusy refuses a run whose thread has another run still active (THREADS.md section
// 6, multitaskStrategy reject); the error is a *BusyError.
var ErrThreadBusy = errors.New("jetstream: the thread has a run in progress")

// BusyError is ErrThreadBusy with the thread's active run.
type BusyError struct{ ActiveRun string }

func (e *BusyError) Error() string        { return ErrThreadBusy.Error() + ": " + e.ActiveRun }
func (e *BusyError) Is(target error) bool { return target == ErrThreadBusy }

// Ended reports whether a run of the principal has stored its terminal: a thread shows its
// runs running until their finish lands, a moment after.
type Ended func(ctx context.Context, runID string) (bool, error)

// BusyWith returns the newest run of the thread accepted before runID (every run, when the
// thread does not hold runID) that is still active: queued, or running and not ended. ""
// when none.
func (t *ThreadHead) BusyWith(ctx context.Context, runID string, ended Ended) (string, error) {
	before := t.Runs
	if i := slices.IndexFunc(t.Runs, func(r ThreadRun) bool { return r.RunID == runID }); i >= 0 {
		before = t.Runs[:i]
	}
	for _, r := range slices.Backward(before) {
		switch r.State {
		case ThreadRunQueued:
			return r.RunID, nil
		case ThreadRunRunning:
			if done, err := ended(ctx, r.RunID); err != nil || !done {
				return r.RunID, err
			}
		}
	}
	return "", nil
}

// Overlap is what AcceptRun does with a run while a run of its thread accepted before it is
// active (THREADS.md section 6). The zero Overlap accepts it beside that run (concurrent).
type Overlap struct {
	// Ended, if set, tells running runs that stored their terminal from the others: the
	// run is accepted only once no earlier run is active (BusyWith), else refused with a
	// *BusyError (reject) ...
	Ended Ended
	// ... or, with Queue, recorded queued (enqueue): its input waits outside the
	// transcript, and an AcceptRun of it again starts it once no earlier run is active. A
	// thread holds at most MaxQueued queued runs; beyond, a *BusyError.
	Queue bool
	// Rollback, with Queue, takes the runs running when the run is queued out of the
	// transcript (multitaskStrategy rollback): their messages leave it, and their replies
	// never enter it (withdraw).
	Rollback bool
}

// MaxQueued bounds the queued runs of a thread.
const MaxQueued = 16

// RunState returns the state of the thread's run runID, "" when the thread does not hold it.
func (t *ThreadHead) RunState(runID string) string {
	if i := slices.IndexFunc(t.Runs, func(r ThreadRun) bool { return r.RunID == runID }); i >= 0 {
		return t.Runs[i].State
	}
	return ""
}

// Ahead returns how many runs accepted before runID have not ended (queued or running).
func (t *ThreadHead) Ahead(runID string) int {
	n := 0
	for _, r := range t.Runs {
		if r.RunID == runID {
			break
		}
		if active(r.State) {
			n++
		}
	}
	return n
}

// countQueued returns how many of runs are queued.
func countQueued(runs []ThreadRun) int {
	n := 0
	for _, r := range runs {
		if r.State == ThreadRunQueued {
			n++
		}
	}
	return n
}

// active reports whether a run in state has not ended: queued or running.
func active(state string) bool { return state == ThreadRunRunning || state == ThreadRunQueued }

// States of a thread's run.
const (
	ThreadRunQueued      = "queued"      // accepted behind earlier runs (Overlap.Queue), not started: its input is not in the transcript yet
	ThreadRunRunning     = "running"     // accepted, no terminal stored yet
	ThreadRunFinished    = "finished"    // ended with RUN_FINISHED
	ThreadRunInterrupted = "interrupted" // ended with RUN_FINISHED and an interrupt outcome
	ThreadRunError       = "error"       // ended with RUN_ERROR (Code says why)
)

// ThreadRun is one run of a thread, in order of acceptance.
type ThreadRun struct {
	RunID   string    `json:"runId"`
	State   string    `json:"state"`
	Code    string    `json:"code,omitempty"` // the RUN_ERROR's code
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended,omitzero"`
	// Added are the messages the run's acceptance added, while it runs (a later run may roll
	// it back); Rollback, for a queued run, the runs it rolls back when it starts.
	Added    []string `json:"added,omitempty"`
	Rollback []string `json:"rollback,omitempty"`
	// Forked is set for a run whose acceptance kept what it replaced as a branch (a
	// regenerate, an edit): its finish tells the thread's followers (a thread.branch frame).
	Forked bool `json:"forked,omitempty"`
}

// Thread is what the store keeps of (principal, threadId) under its key: its head (runs,
// title, times) and its transcript's hot tail; Sealed names the older messages, in records
// of their own (log.go).
type Thread struct {
	ThreadHead
	// Dropped counts the oldest messages that a value written before threads were split
	// across parts left out of Transcript to fit in one NATS message; none are left out now.
	Dropped int `json:"dropped,omitempty"`
	// Transcript is the transcript but for its sealed messages: all of it while Sealed is nil.
	Transcript thread.Transcript `json:"transcript"`
	Sealed     *Sealed           `json:"sealed,omitempty"`
	// Forks are where regenerates and edits branched the thread (branch.go).
	Forks []Fork `json:"forks,omitempty"`
}

// ThreadHead is a Thread without its transcript.
type ThreadHead struct {
	Principal string      `json:"principal"`
	ThreadID  string      `json:"threadId"`
	Title     string      `json:"title"`
	Created   time.Time   `json:"created"`
	Updated   time.Time   `json:"updated"`
	Runs      []ThreadRun `json:"runs"`
}

// ActiveRun returns the newest run still running, "" when none.
func (t *ThreadHead) ActiveRun() string {
	for i := len(t.Runs) - 1; i >= 0; i-- {
		if t.Runs[i].State == ThreadRunRunning {
			return t.Runs[i].RunID
		}
	}
	return ""
}

func (t *Thread) run(runID string) *ThreadRun {
	for i := range t.Runs {
		if t.Runs[i].RunID == runID {
			return &t.Runs[i]
		}
	}
	return nil
}

// titleLen is the length of a thread's title, in characters.
const titleLen = 80

// title returns the text of the transcript's first user message, cut to titleLen characters.
func title(tr *thread.Transcript) string {
	for _, m := range tr.Messages {
		if m.Role != "user" {
			continue
		}
		for _, p := range m.Parts {
			if p.Type == "text" {
				s := strings.TrimSpace(p.Content)
				if utf8.RuneCountInString(s) > titleLen {
					s = string([]rune(s)[:titleLen])
				}
				return s
			}
		}
		return ""
	}
	return ""
}

// threadKey names a thread's value: the hash of its principal, then the hash of the
// length-delimited principal and threadId, so that a principal's threads share a prefix
// (Threads lists them) and no key reveals a principal or a threadId.
func threadKey(principal, threadID string) string {
	k := [2]string{principal, threadID}
	threadKeys.Lock()
	key, ok := threadKeys.m[k]
	threadKeys.Unlock()
	if ok {
		return key
	}
	key = principalPrefix(principal) + "." + jetstream.PairKey("thread", principal, threadID)
	threadKeys.Lock()
	if len(threadKeys.m) >= threadKeysKept {
		clear(threadKeys.m) // the threads in use are named again at their next turn
	}
	// Copies: a caller's strings may be slices of a larger input the map would keep.
	threadKeys.m[[2]string{strings.Clone(principal), strings.Clone(threadID)}] = key
	threadKeys.Unlock()
	return key
}

// threadKeys keeps the keys of the threads named last: a turn names its thread's key a dozen
// times (its acceptance, its agent's context, its finish, their reads and writes), each two
// SHA-256 sums.
var threadKeys = struct {
	sync.Mutex
	m map[[2]string]string
}{m: map[[2]string]string{}}

// threadKeysKept bounds threadKeys.
const threadKeysKept = 1024

func principalPrefix(principal string) string {
	h := sha256.Sum256([]byte("principal\x00" + principal))
	return jetstream.KeyEncoding.EncodeToString(h[:])
}

// threadAttempts bounds the compare-and-set attempts of one thread update.
const threadAttempts = 100

// threadHold lets one of a store's updates of a thread run at a time, and hands the value
// each wrote to the next: when a run starts as the previous run of its thread ends, the
// second of their updates starts from the value the first wrote, instead of failing the
// compare-and-set behind it and reading the thread again. It lives while updates hold it or
// wait for it.
type threadHold struct {
	mu   sync.Mutex
	refs int         // updates holding or waiting; guarded by Store.holdsMu
	val  *threadRead // what the previous update wrote; nil: read it
}

// hold returns the thread key's hold, locked.
func (s *Store) hold(key string) *threadHold {
	s.holdsMu.Lock()
	h := s.holds[key]
	if h == nil {
		h = &threadHold{}
		s.holds[key] = h
	}
	h.refs++
	s.holdsMu.Unlock()
	h.mu.Lock()
	return h
}

// release unlocks the thread key's hold, and forgets it when no update waits for it.
func (s *Store) release(key string, h *threadHold) {
	h.mu.Unlock()
	s.holdsMu.Lock()
	if h.refs--; h.refs == 0 {
		delete(s.holds, key)
		if h.val != nil { // no update waits for it: the next one, or a read ahead, may take it
			s.kept.keep(key, h.val)
		}
	}
	s.holdsMu.Unlock()
}

// updateThread applies f to the thread's current value and writes the result if f reports a
// change, conditionally on the revision it read (created if it read none); on a conflict it
// reads again and reapplies f. f sees exists false (and a zero Thread) for a missing thread.
// The store's updates of one thread run one at a time, each from the value the previous one
// wrote (threadHold); the first, when no update precedes it, from ahead's read if not nil.
func (s *Store) updateThread(ctx context.Context, principal, threadID string, ahead *ThreadAhead, f func(t *Thread, exists bool) (bool, error)) error {
	key := threadKey(principal, threadID)
	h := s.hold(key)
	defer s.release(key, h)
	for attempt := 0; attempt < threadAttempts; attempt++ {
		r := h.val  // what the previous update wrote, if it did
		h.val = nil // the next attempt reads the thread
		if r == nil && ahead != nil {
			r, _ = ahead.read(ctx) // failed: read the thread again
		}
		ahead = nil
		if r == nil {
			var err error
			if r, err = s.readThread(ctx, key, true); err != nil {
				return err
			}
		}
		t := r.t
		exists := r.rev != 0 && t.Principal == principal && t.ThreadID == threadID
		if !exists {
			t = &Thread{}
		}
		changed, err := f(t, exists)
		if err != nil || !changed {
			return err
		}
		t.Principal, t.ThreadID = principal, threadID
		w, err := s.writeThread(ctx, key, t, r)
		if err == nil {
			h.val = w
			return nil
		}
		if !bucket.IsWrongLastSeq(err) && !errors.Is(err, natsjs.ErrKeyExists) {
			return fmt.Errorf("thread: %w", err)
		}
		// Another gateway wrote the thread meanwhile: read it again, at once the first time
		// (its write is done), then after a short random pause so that writers in step
		// drift apart.
		if attempt > 0 {
			select {
			case <-time.After(time.Duration(rand.IntN(5*attempt+1)) * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return errors.New("thread: too many concurrent updates")
}

// threadRead is a thread as read from (or written to) the bucket: its value decoded, its
// revision (0: none), the parts its value names (nil: none) and the size of its JSON, parts
// included (as written; 0 as read).
type threadRead struct {
	t     *Thread
	rev   uint64
	parts *threadParts
	size  int
}

// threadParts names the records that hold a thread too large for one NATS message: keys
// <thread key>.<ID>.<i> for i in [0, N), whose values, concatenated, are the thread's JSON.
// Each write of such a thread writes its parts under a new ID before the compare-and-set of
// its value, so that a reader never mixes two writes, and purges the parts of the value it
// replaced after.
type threadParts struct {
	ID string `json:"id"`
	N  int    `json:"n"`
}

// threadValue is the value under a thread's key: the whole thread, or, when that does not
// fit in one NATS message, its head (with its running runs only) and the parts that hold it.
type threadValue struct {
	Thread
	Parts *threadParts `json:"parts,omitempty"`
}

// writeThread writes t under key, conditionally on prev's revision (created if none), and
// returns what it wrote. A thread whose JSON does not fit in one NATS message (the server's
// max payload less room for headers) is split across parts (threadParts); no message is
// ever left out.
func (s *Store) writeThread(ctx context.Context, key string, t *Thread, prev *threadRead) (*threadRead, error) {
	limit := int(s.nc.MaxPayload()) - 4096
	b, err := threadValue{Thread: *t}.appendJSON(nil)
	if err != nil {
		return nil, err
	}
	size := len(b)
	var parts *threadParts
	if len(b) > limit {
		if parts, err = s.writeParts(ctx, key, b, limit); err != nil {
			return nil, err
		}
		head := threadValue{Thread: Thread{ThreadHead: t.ThreadHead}, Parts: parts}
		head.Runs = nil
		if id := t.ActiveRun(); id != "" {
			head.Runs = []ThreadRun{*t.run(id)}
		}
		if b, err = head.appendJSON(nil); err != nil {
			return nil, err
		}
	}
	rev, err := s.putHead(ctx, key, b, t, prev.rev)
	if err != nil {
		s.purgeParts(key, parts)
		return nil, err
	}
	s.purgeParts(key, prev.parts)
	return &threadRead{t: t, rev: rev, parts: parts, size: size}, nil
}

// writeParts writes b across the parts of key, each at most limit bytes, under a new ID, all
// at once.
func (s *Store) writeParts(ctx context.Context, key string, b []byte, limit int) (*threadParts, error) {
	var id [8]byte
	for i := range id {
		id[i] = byte(rand.Uint32())
	}
	p := &threadParts{ID: jetstream.KeyEncoding.EncodeToString(id[:]), N: (len(b) + limit - 1) / limit}
	s.threadBytes.Add(int64(len(b) + p.N*len(p.key(key, 0))))
	errs := make([]error, p.N)
	var wg sync.WaitGroup
	for i := range p.N {
		wg.Go(func() {
			_, errs[i] = s.threads.Put(ctx, p.key(key, i), b[i*limit:min(len(b), (i+1)*limit)])
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		s.purgeParts(key, p)
		return nil, fmt.Errorf("thread: %w", err)
	}
	return p, nil
}

// key returns the key of the thread key's part i.
func (p *threadParts) key(key string, i int) string { return key + "." + p.ID + "." + strconv.Itoa(i) }

// purgeParts removes the thread key's parts p, if not nil, in the background: a failure
// leaves them to the bucket's TTL.
func (s *Store) purgeParts(key string, p *threadParts) {
	if p == nil {
		return
	}
	s.background("purging a replaced thread value", "", func(ctx context.Context) error {
		for i := range p.N {
			if err := s.threads.Purge(ctx, p.key(key, i)); err != nil {
				return err
			}
		}
		return nil
	})
}

// readThread returns the thread under key as read; none (a zero Thread, revision 0) when
// the thread does not exist. A value whose parts a newer write purged meanwhile is read again.
// take, for a read that will change the thread (an update, a read ahead of one), takes what
// this store kept of the value it wrote last (keep.go) when that is still the thread's
// value, instead of decoding it again.
func (s *Store) readThread(ctx context.Context, key string, take bool) (*threadRead, error) {
	for attempt := 0; ; attempt++ {
		e, err := s.threads.Get(ctx, key)
		switch {
		case errors.Is(err, natsjs.ErrKeyNotFound):
			return &threadRead{t: &Thread{}}, nil
		case err != nil:
			return nil, fmt.Errorf("thread: %w", err)
		}
		r, err := s.decodeThread(ctx, key, e, take)
		if r != nil || err != nil {
			return r, err
		}
		if attempt == threadAttempts {
			return nil, errors.New("thread: its value keeps being replaced")
		}
	}
}

// decodeThread returns the thread of e, the value read under key (taken from what this store
// kept, with take); nil and no error when the parts it names were purged meanwhile (a newer
// write replaced it).
func (s *Store) decodeThread(ctx context.Context, key string, e natsjs.KeyValueEntry, take bool) (*threadRead, error) {
	if take {
		if r := s.kept.take(key, e.Revision()); r != nil {
			return r, nil
		}
	}
	var v threadValue
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		return nil, fmt.Errorf("thread: %w", err)
	}
	r := &threadRead{t: &v.Thread, rev: e.Revision(), parts: v.Parts}
	if v.Parts == nil {
		return r, nil
	}
	b, err := s.readParts(ctx, key, v.Parts)
	if err != nil || b == nil {
		return nil, err
	}
	var t Thread
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("thread: %w", err)
	}
	r.t = &t
	return r, nil
}

// readParts returns the concatenated values of the thread key's parts p; nil if one of them
// is gone (purged by a newer write, or expired).
func (s *Store) readParts(ctx context.Context, key string, p *threadParts) ([]byte, error) {
	var b []byte
	for i := range p.N {
		pe, err := s.threads.Get(ctx, p.key(key, i))
		if errors.Is(err, natsjs.ErrKeyNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("thread: %w", err)
		}
		b = append(b, pe.Value()...)
	}
	return b, nil
}

// ThreadAhead is a thread read ahead of its update (ReadThreadAhead). The value read is
// decoded when it is first used: an update that starts from the value this store's previous
// update of the thread wrote (threadHold) never decodes it.
type ThreadAhead struct {
	s    *Store
	key  string
	done chan struct{}
	// threads is how many threads the principal has, counted when the read found none and
	// Config.MaxThreadsPerPrincipal bounds them; -1: not counted.
	threads int

	mu  sync.Mutex
	e   natsjs.KeyValueEntry // the value read, until it is decoded into r
	r   *threadRead
	err error
}

// read waits for the read and returns the thread it read, decoded.
func (a *ThreadAhead) read(ctx context.Context) (*threadRead, error) {
	<-a.done
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.e != nil {
		a.r, a.err = a.s.decodeThread(ctx, a.key, a.e, true)
		if a.r == nil && a.err == nil { // replaced meanwhile
			a.r, a.err = a.s.readThread(ctx, a.key, true)
		}
		a.e = nil
	}
	return a.r, a.err
}

// Head waits for the read and returns the thread's head as read (with no runs when the
// thread does not exist yet).
func (a *ThreadAhead) Head(ctx context.Context, principal, threadID string) (*ThreadHead, error) {
	r, err := a.read(ctx)
	if err != nil {
		return nil, err
	}
	if t := r.t; r.rev != 0 && t.Principal == principal && t.ThreadID == threadID {
		return &t.ThreadHead, nil
	}
	return &ThreadHead{}, nil
}

// ReadThreadAhead starts reading the principal's thread for an AcceptRun that follows, so
// that the read goes on while the caller does something else first (creates the run's log).
// An AcceptRun given it starts from what it read, unless an update of the thread through
// this store came after (it then starts from what that update wrote); a read made stale by
// another gateway's write costs its compare-and-set and a read again.
func (s *Store) ReadThreadAhead(ctx context.Context, principal, threadID string) *ThreadAhead {
	a := &ThreadAhead{s: s, key: threadKey(principal, threadID), done: make(chan struct{}), threads: -1}
	go func() {
		defer close(a.done)
		e, err := s.threads.Get(ctx, a.key)
		switch {
		case errors.Is(err, natsjs.ErrKeyNotFound):
			a.r = &threadRead{t: &Thread{}}
			if s.cfg.MaxThreadsPerPrincipal > 0 {
				if n, err := s.threadCount(ctx, principal); err == nil {
					a.threads = n
				}
			}
		case err != nil:
			a.err = fmt.Errorf("thread: %w", err)
		default:
			a.e = e
		}
	}()
	return a
}

// AcceptRun records a newly accepted run of the principal's thread (state running) and merges
// its input (RunAgentInput JSON) into the transcript, creating the thread if needed. A run
// accepted again (a resubmit) is running again. ahead, if not nil, is the thread read ahead.
// It returns a copy of the thread as it wrote it (the run's agent takes its context from it:
// THREADS.md section 5). While a run accepted before it is active, o says what happens: the
// run is accepted beside it, refused, or queued (its RunState in the copy returned says so,
// and a queued run's AcceptRun again leaves the thread unchanged until it starts).
func (s *Store) AcceptRun(ctx context.Context, principal, threadID, runID string, input json.RawMessage, ahead *ThreadAhead, o Overlap) (*Thread, error) {
	var written *Thread
	var created bool
	key := threadKey(principal, threadID)
	err := s.updateThread(ctx, principal, threadID, ahead, func(t *Thread, exists bool) (bool, error) {
		created = !exists
		defer func() { // the next update of the thread starts from t, and changes it
			written = &Thread{ThreadHead: t.ThreadHead, Transcript: t.Transcript.Clone(), Sealed: t.Sealed, Forks: cloneForks(t.Forks)}
			written.Runs = slices.Clone(t.Runs)
			written.Principal, written.ThreadID = principal, threadID
		}()
		now := time.Now().UTC()
		if o.Ended != nil {
			busy, err := t.BusyWith(ctx, runID, o.Ended)
			switch {
			case err != nil:
				return false, err
			case busy == "":
			case !o.Queue:
				return false, &BusyError{ActiveRun: busy}
			case t.RunState(runID) == ThreadRunQueued:
				return false, nil // still waiting
			case countQueued(t.Runs) >= MaxQueued:
				return false, &BusyError{ActiveRun: busy}
			default:
				q := ThreadRun{RunID: runID, State: ThreadRunQueued, Started: now}
				if o.Rollback {
					for _, r := range t.Runs {
						if r.State == ThreadRunRunning {
							q.Rollback = append(q.Rollback, r.RunID)
						}
					}
				}
				if r := t.run(runID); r != nil {
					*r = q // a resubmit: one entry per run, in its place, as a running one's
				} else {
					t.Runs = append(t.Runs, q)
				}
				t.Updated = now
				return true, nil
			}
		}
		if !exists {
			if max := s.cfg.MaxThreadsPerPrincipal; max > 0 {
				n := -1
				if ahead != nil {
					<-ahead.done
					n = ahead.threads
				}
				if n < 0 {
					var err error
					if n, err = s.threadCount(ctx, principal); err != nil {
						return false, err
					}
				}
				if n >= max {
					return false, ErrThreadLimit
				}
			}
			t.Created = now
		}
		if err := s.finishAnswered(ctx, key, t, runID, input); err != nil {
			return false, err
		}
		input, err := s.knownInput(ctx, key, t, input)
		if err != nil {
			return false, err
		}
		known := t.Transcript.IDs()
		if err := t.Transcript.Accept(runID, input); err != nil {
			return false, err
		}
		forked, err := s.keepCut(ctx, key, t)
		if err != nil {
			return false, err
		}
		t.settleForks()
		started := ThreadRun{RunID: runID, State: ThreadRunRunning, Started: now, Forked: forked}
		for _, m := range t.Transcript.Messages {
			if !known[m.ID] {
				started.Added = append(started.Added, m.ID)
			}
		}
		if r := t.run(runID); r != nil {
			if err := s.rollBack(ctx, principal, key, t, r.Rollback); err != nil {
				return false, err
			}
			*r = started
		} else {
			t.Runs = append(t.Runs, started)
		}
		if t.Title == "" {
			t.Title = title(&t.Transcript)
		}
		t.Updated = now
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	if created {
		s.counted(principal, 1)
	}
	return written, nil
}

// FinishRun applies a run's stored events (its log from the run.accepted marker to its
// terminal) to its thread's transcript and records how it ended, in one update. It does
// nothing for a run that the thread does not hold as running (finished already, or its thread
// deleted).
func (s *Store) FinishRun(ctx context.Context, principal, threadID, runID string, events []json.RawMessage) error {
	var settled *Thread
	var leaf string // a forked run's: the active branch's newest message
	err := s.updateThread(ctx, principal, threadID, nil, func(t *Thread, exists bool) (bool, error) {
		settled, leaf = nil, ""
		r := t.run(runID)
		if !exists || r == nil || !active(r.State) {
			return false, nil
		}
		if r.State == ThreadRunQueued { // ended before it started (aborted, reaped)
			r.State, r.Code = endState(events)
			r.Ended = time.Now().UTC()
			t.Updated = r.Ended
			return true, nil
		}
		forked := r.Forked
		if err := s.finishIn(ctx, threadKey(principal, threadID), t, r, events); err != nil {
			return false, err
		}
		if n := len(t.Transcript.Messages); forked && n > 0 {
			leaf = t.Transcript.Messages[n-1].ID
		}
		// What the finish settled, as written: the next updates change t.
		settled = &Thread{ThreadHead: t.ThreadHead, Sealed: t.Sealed, Forks: cloneForks(t.Forks)}
		settled.Runs = slices.Clone(t.Runs)
		settled.Transcript.Messages = thread.Transcript{Messages: t.Transcript.Messages[:sealable(t)]}.Clone().Messages
		if s.sealNow(ctx, threadKey(principal, threadID), t, settled) {
			settled = nil
		}
		return true, nil
	})
	if err == nil && settled != nil {
		s.sealLater(principal, threadID, settled)
	}
	if err == nil && leaf != "" {
		s.announceBranch(principal, threadID, leaf)
	}
	return err
}

// sealNow seals what a run's finish settled in t (settled: a copy of t with only those
// messages in its hot tail) within the finish's update: it writes their record, and the head
// the finish writes names it instead of holding them, so that a turn writes its reply once
// (docs/THREADS.md, "How a thread is stored"). It reports whether it sealed; a record
// that fails (bounded by sealUpdateTimeout), or a thread whose older records are due to be
// written again, is left to sealLater, as is a conflict's retry of the update, which writes a
// record of its own (the unused one is left to the TTL).
func (s *Store) sealNow(ctx context.Context, key string, t, settled *Thread) bool {
	if len(settled.Transcript.Messages) == 0 || settled.Sealed != nil && time.Since(settled.Sealed.Oldest) > s.cfg.Retention/2 {
		return false
	}
	wctx, cancel := context.WithTimeout(ctx, sealUpdateTimeout)
	defer cancel()
	plan, err := s.planSeal(wctx, key, settled, false)
	if err != nil {
		s.log.Debug("threadstore: sealing a finished run's messages: left to a later seal", keyErr, err)
		return false
	}
	return plan.apply(t)
}

// finishAnswered applies, before runID's acceptance, the finish of every earlier run whose
// reply goes right after the message runID's input ends with (a regenerate of that reply)
// and whose log has ended, when that finish has not reached t yet (its gateway writes it
// now): the regenerate then finds the reply, and keeps it as a branch. A log that cannot be
// read leaves the run to its own finish.
func (s *Store) finishAnswered(ctx context.Context, key string, t *Thread, runID string, input json.RawMessage) error {
	if !slices.ContainsFunc(t.Transcript.Anchors, func(a thread.Anchor) bool { return a.Run != runID }) {
		return nil // no earlier run unfinished: nothing to read
	}
	posted := postedMessages(input)
	last := ""
	for _, m := range slices.Backward(posted) {
		if m.Role == "user" || m.Role == "system" || m.Role == "assistant" {
			last = m.ID
			break
		}
	}
	if last == "" {
		return nil
	}
	for _, id := range t.Transcript.AnchoredAfter(last) {
		r := t.run(id)
		if id == runID || r == nil || r.State != ThreadRunRunning {
			continue
		}
		entries, closed, err := s.runs.Snapshot(ctx, t.Principal, id)
		if err != nil || !logEnded(entries, closed) {
			continue
		}
		if err := s.finishIn(ctx, key, t, r, eventsOf(entries)); err != nil {
			return err
		}
	}
	return nil
}

// rollBack finishes the runs rollback names (a starting run's, queued with
// multitaskStrategy rollback) whose finish has not reached t yet, from their logs, which
// withdraws those that ended with RUN_ERROR (finishIn); then it takes the messages of the
// withdrawn ones out again (the run starting may have posted them once more).
func (s *Store) rollBack(ctx context.Context, principal, key string, t *Thread, rollback []string) error {
	for _, id := range rollback {
		r := t.run(id)
		if r == nil {
			continue
		}
		if r.State == ThreadRunRunning {
			entries, closed, err := s.runs.Snapshot(ctx, principal, id)
			if err != nil {
				return fmt.Errorf("thread: reading a run rolled back: %w", err)
			}
			if logEnded(entries, closed) {
				if err := s.finishIn(ctx, key, t, r, eventsOf(entries)); err != nil {
					return err
				}
			}
		}
		if len(r.Added) > 0 && r.State == ThreadRunError {
			t.withdraw(id, r.Added)
			r.Added = nil
		}
	}
	return nil
}

// withdraw takes runID's messages ids out of t's transcript (thread.Transcript.Withdraw),
// and the title they gave a thread that holds all its messages in its head.
func (t *Thread) withdraw(runID string, ids []string) {
	t.Transcript.Withdraw(runID, ids)
	if t.Sealed == nil {
		t.Title = title(&t.Transcript)
	}
}

// rolledBack reports whether a queued run of t rolls runID back.
func (t *Thread) rolledBack(runID string) bool {
	return slices.ContainsFunc(t.Runs, func(q ThreadRun) bool {
		return q.State == ThreadRunQueued && slices.Contains(q.Rollback, runID)
	})
}

// finishIn applies the ended run r's events to t and records how it ended; a run that a
// queued run rolls back, and that ended with RUN_ERROR (a run that finished before the
// rollback reached it keeps its reply), is withdrawn instead, its messages kept in r.Added
// for that run's start.
func (s *Store) finishIn(ctx context.Context, key string, t *Thread, r *ThreadRun, events []json.RawMessage) error {
	state, code := endState(events)
	if state == ThreadRunError && t.rolledBack(r.RunID) {
		t.withdraw(r.RunID, r.Added)
	} else {
		r.Added = nil
		if t.Sealed != nil && slices.ContainsFunc(events, isSnapshot) {
			// A MESSAGES_SNAPSHOT replaces the whole list: the run's finish needs it whole.
			if err := s.unseal(ctx, key, t, 0); err != nil {
				return err
			}
		}
		if err := t.Transcript.Finish(r.RunID, events); err != nil {
			return err
		}
		t.settleForks()
	}
	r.State, r.Code, r.Forked = state, code, false
	r.Ended = time.Now().UTC()
	t.Updated = r.Ended
	return nil
}

// isSnapshot reports whether event is a MESSAGES_SNAPSHOT.
func isSnapshot(event json.RawMessage) bool {
	if !bytes.Contains(event, []byte("MESSAGES_SNAPSHOT")) {
		return false
	}
	var ev struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(event, &ev) == nil && ev.Type == "MESSAGES_SNAPSHOT"
}

// endState returns how a run whose log holds events ended: as its last terminal says, or as
// the reaper's producer_lost terminal says when it holds none.
func endState(events []json.RawMessage) (state, code string) {
	var end protocol.End
	var ok bool
	for i := len(events) - 1; i >= 0 && !ok; i-- {
		end, ok = protocol.EndOf(events[i])
	}
	if !ok {
		end, _ = protocol.EndOf(jetstream.ProducerLost)
	}
	switch end.Kind {
	case protocol.EndFinished:
		return ThreadRunFinished, ""
	case protocol.EndInterrupted:
		return ThreadRunInterrupted, ""
	}
	return ThreadRunError, end.Code
}

// finishReaped finishes the thread of a run the reaper closed, from its log.
func (s *Store) finishReaped(ctx context.Context, info jetstream.RunInfo) error {
	if info.ThreadID == "" {
		return nil
	}
	entries, _, err := s.runs.Snapshot(ctx, info.Principal, info.RunID)
	if err != nil {
		return err
	}
	return s.FinishRun(ctx, info.Principal, info.ThreadID, info.RunID, eventsOf(entries))
}

// logEnded reports whether a run's log, as a Snapshot read it, holds the run's end: it is
// closed, or its last event is a terminal (stored before the close that follows it).
func logEnded(entries []jetstream.Entry, closed bool) bool {
	if closed {
		return true
	}
	if len(entries) == 0 {
		return false
	}
	_, ok := protocol.EndOf(entries[len(entries)-1].Event)
	return ok
}

// eventsOf returns the events of entries.
func eventsOf(entries []jetstream.Entry) []json.RawMessage {
	events := make([]json.RawMessage, len(entries))
	for i, e := range entries {
		events[i] = e.Event
	}
	return events
}

// Thread returns the principal's thread, or ErrUnknownThread.
func (s *Store) Thread(ctx context.Context, principal, threadID string) (*Thread, error) {
	r, err := s.readThread(ctx, threadKey(principal, threadID), false)
	if err != nil {
		return nil, err
	}
	if r.rev == 0 || r.t.Principal != principal || r.t.ThreadID != threadID {
		return nil, ErrUnknownThread
	}
	return r.t, nil
}

// ThreadSummary is a thread as a list shows it.
type ThreadSummary struct {
	ThreadID  string    `json:"threadId"`
	Title     string    `json:"title"`
	Created   time.Time `json:"created"`
	Updated   time.Time `json:"updated"`
	ActiveRun string    `json:"activeRun,omitempty"` // "" when none
}

// Threads returns the principal's threads, most recently updated first (ties by threadId).
// It reads their heads' headers only (head.go).
func (s *Store) Threads(ctx context.Context, principal string) ([]ThreadSummary, error) {
	list, _, err := s.threadsRead(ctx, principal)
	return list, err
}

// DeleteThread removes the principal's thread and its runs' logs and metadata; a run still
// running is asked to abort first. It returns ErrUnknownThread for a thread the principal
// does not have.
func (s *Store) DeleteThread(ctx context.Context, principal, threadID string) error {
	key := threadKey(principal, threadID)
	r, err := s.readThread(ctx, key, false)
	if err != nil {
		return err
	}
	t := r.t
	if r.rev == 0 || t.Principal != principal || t.ThreadID != threadID {
		return ErrUnknownThread
	}
	runs, err := s.AllRuns(ctx, t) // read before the purge
	if err != nil {
		return fmt.Errorf("delete thread: %w", err)
	}
	s.kept.forget(key)
	// The head's subject purged whole, with no marker left: a thread count (threadCount)
	// counts the subjects that hold heads.
	if err := s.threadStream.Purge(ctx, natsjs.WithPurgeSubject(s.headSubject(key))); err != nil {
		return fmt.Errorf("delete thread: %w", err)
	}
	s.counted(principal, -1)
	// Its parts, records and segments: every key below the thread's.
	if err := s.threadStream.Purge(ctx, natsjs.WithPurgeSubject(s.headSubject(key)+".>")); err != nil {
		return fmt.Errorf("delete thread: %w", err)
	}
	var errs []error
	for _, r := range runs {
		if active(r.State) {
			errs = append(errs, s.runs.RequestAbort(principal, r.RunID, ""))
		}
		errs = append(errs, s.runs.DeleteRun(ctx, principal, threadID, r.RunID))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete thread: %w", err)
	}
	return nil
}
