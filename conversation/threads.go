package conversation

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/turn"
)

// threadTimeout bounds a thread update of a turn's start or end, and a hydrate's reads.
const threadTimeout = 10 * time.Second

// threadRun records a run in its thread, as turn.Thread: as accepted while the run's first
// event is stored, which is delivered once the thread is written (so that a hydrate from the
// run's first event on reports it), and finished once its log is closed (so that readers of
// the log reach its end without waiting for the thread; until then a hydrate reports the run
// as active, and a client that joins it replays the closed log). A log that failed is left
// to whoever ends it (the reaper, a resubmit). A thread update that fails (NATS away, a
// stall) is logged and tried again until it lands (untilLanded): the turn goes on meanwhile,
// and the run reaches its thread once NATS answers again.
type threadRun struct {
	srv                        *Server
	principal, threadID, runID string
	log                        *slog.Logger
	accepted                   chan struct{} // closed once the thread was written (or its first try failed), and the run announced
	// refusal is set, before accepted is closed, when the thread refuses the run: it would
	// start a thread beyond the principal's (ErrThreadLimit), or another run of
	// the thread is active and the run's strategy is reject (*BusyError). The
	// turn ends with it, and nothing is announced.
	refusal atomic.Pointer[turn.Refusal]
	landed  chan struct{} // closed once the thread was written, or the server stopped trying
	// written is the thread as the first try of the run's acceptance wrote it (nil: that try
	// failed), set before accepted is closed, or, for a queued run, as its start wrote it:
	// the run's agent takes its context from it.
	written Thread
	// ahead, set before accepted is closed, is how many earlier runs of the thread a run
	// its first try queued waits for (0: not queued); overlap and input start it.
	ahead   int
	overlap Overlap
	input   json.RawMessage

	// The events appended, kept while they fit in threadEventsMemory bytes: the run's end
	// builds its thread from them; a longer run's end reads its log back.
	mu     sync.Mutex
	events []json.RawMessage
	size   int // bytes of every event appended
	count  int // events appended
	over   bool
}

// threadEventsMemory bounds the bytes of events a run keeps for its thread's update.
const threadEventsMemory = 256 << 10

// Accepted is closed once the run's acceptance was written into its thread (or its first
// try failed), and the run announced.
func (l *threadRun) Accepted() <-chan struct{} { return l.accepted }

// Keep keeps event for the thread. A terminal ends the run's events: the thread's next run,
// whose client may post it as soon as it has the terminal, reads them here until the thread
// has them (Server.settled), which Closed ends.
func (l *threadRun) Keep(event []byte, terminal bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.size += len(event)
	l.count++
	switch {
	case l.over:
	case l.size > threadEventsMemory:
		l.over, l.events = true, nil
		l.srv.settled.Delete(runKey{l.principal, l.runID}) // read from the log instead
	default:
		l.events = append(l.events, event)
		if terminal {
			l.srv.settled.Store(runKey{l.principal, l.runID}, l.events)
		}
	}
}

// newThreadRun starts recording the run of in (the slot s) as accepted in its thread, from
// ahead (the thread read while the run's log was created), at the same time as the run's
// first event is stored; the run is announced once its thread is written. The write waits
// for no event: a new run's first event is stored in the write's round trip.
// A run queued with interrupt set interrupts the runs running before it (multitaskStrategy
// interrupt), which end RUN_ERROR code interrupted, so that it starts at once.
func (srv *Server) newThreadRun(s *slot, in *protocol.RunAgentInput, ahead ThreadAhead, o Overlap, interrupt bool, log *slog.Logger) *threadRun {
	l := &threadRun{srv: srv, principal: s.key.principal, threadID: in.ThreadID, runID: in.RunID, log: log,
		accepted: make(chan struct{}), landed: make(chan struct{}), overlap: o, input: in.JSON()}
	go func() {
		defer close(l.landed)
		var once sync.Once
		accepted := func() {
			once.Do(func() {
				close(l.accepted)
				if l.refusal.Load() == nil {
					srv.announce(s, log)
				}
			})
		}
		defer accepted()
		first := true
		srv.untilLanded(log, "recording the run in its thread", func(ctx context.Context) error {
			t, err := srv.cfg.Threads.AcceptRun(ctx, l.principal, in.ThreadID, in.RunID, l.input, ahead, o)
			var busy *BusyError
			switch {
			case errors.Is(err, ErrThreadLimit):
				log.Info("run refused: max-threads-per-principal")
				srv.cfg.Metrics.LimitRefused(metrics.LimitPrincipalThreads)
				l.refusal.Store(&turn.Refusal{Code: CodeLimitExceeded, Message: MsgTooManyThreads})
				err = nil // refused: nothing to try again
			case errors.As(err, &busy):
				log.Info("run refused: thread busy", slog.String("activeRunId", busy.ActiveRun))
				l.refusal.Store(&turn.Refusal{Code: CodeThreadBusy, Message: MsgThreadBusy})
				err = nil
			}
			if first {
				l.written, first = t, false
				if t != nil && t.RunState(in.RunID) == ThreadRunQueued {
					l.ahead = t.Ahead(in.RunID)
					if interrupt {
						srv.interruptBefore(l.principal, t, in.RunID, log)
					}
				}
			}
			ahead = nil // a retry reads the thread again
			accepted()  // the run's events wait for the first try only
			return err
		})
	}()
	return l
}

// interruptBefore asks that the runs of t running before runID be interrupted.
func (srv *Server) interruptBefore(principal string, t Thread, runID string, log *slog.Logger) {
	for _, r := range t.Runs() {
		if r.RunID == runID {
			return
		}
		if r.State == ThreadRunRunning {
			if err := srv.cfg.Store.RequestInterrupt(principal, r.RunID); err != nil {
				log.Warn("interrupting an earlier run of the thread", slog.String("activeRunId", r.RunID), slog.String(keyErr, err.Error()))
			}
		}
	}
}

// queued is the run's turn.Config.Queued: a run its acceptance queued stores run.queued, and
// starts once AcceptRun, asked again every queuePoll, records it running.
func (l *threadRun) queued() *turn.Queue {
	if l.ahead == 0 {
		return nil
	}
	return &turn.Queue{Event: protocol.RunQueued(l.ahead), Wait: l.waitTurn}
}

// queuePoll is how often a queued run asks its thread whether it may start.
const queuePoll = 200 * time.Millisecond

// waitTurn returns once the queued run's thread records it started, or with ctx's error.
func (l *threadRun) waitTurn(ctx context.Context) error {
	warned := false
	for {
		actx, cancel := context.WithTimeout(ctx, threadTimeout)
		t, err := l.srv.cfg.Threads.AcceptRun(actx, l.principal, l.threadID, l.runID, l.input, nil, l.overlap)
		cancel()
		switch {
		case err == nil && t.RunState(l.runID) != ThreadRunQueued:
			l.written = t
			return nil
		case err != nil && ctx.Err() == nil && !warned:
			warned = true
			l.log.Warn("starting a queued run: trying again", slog.String(keyErr, err.Error()))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(queuePoll):
		}
	}
}

// untilLanded calls write, each call within threadTimeout, until it succeeds or the server
// stops (Shutdown gave up waiting; the first call is made in any case), pausing between calls from 100 ms, doubled each time, up
// to 5 s. The first failure and the last are logged as what. It returns write's last error.
func (srv *Server) untilLanded(log *slog.Logger, what string, write func(ctx context.Context) error) error {
	pause := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		base := srv.ctx
		if attempt == 1 {
			base = context.WithoutCancel(base) // a turn stopped at shutdown still tries once
		}
		ctx, cancel := context.WithTimeout(base, threadTimeout)
		err := write(ctx)
		cancel()
		if err == nil {
			if attempt > 1 {
				log.Info(what+": landed", slog.Int("attempts", attempt))
			}
			return nil
		}
		if attempt == 1 {
			log.Warn(what+": trying again", slog.String(keyErr, err.Error()))
		}
		select {
		case <-srv.ctx.Done():
			log.Warn(what+": given up at shutdown", slog.String(keyErr, err.Error()), slog.Int("attempts", attempt))
			return err
		case <-time.After(pause):
		}
		pause = min(2*pause, 5*time.Second)
	}
}

// Closed finishes the run's thread from its closed log (untilLanded).
func (l *threadRun) Closed(err error) {
	defer l.srv.settled.Delete(runKey{l.principal, l.runID})
	if err == nil {
		release := l.reserveReadBack()
		l.srv.untilLanded(l.log, "finishing the run in its thread", l.finish)
		release()
	}
}

// reserveReadBack waits, for a run too long to keep its events (over), until the memory
// budget has room for its log read back whole and the thread built from it, and charges
// them; it returns the function that gives them back. Runs that end together (a burst of
// long turns, or every turn held through a NATS stall) so read their logs in turn, as the
// budget makes room, instead of all at once. At shutdown it charges nothing.
func (l *threadRun) reserveReadBack() (release func()) {
	l.mu.Lock()
	over, size, count := l.over, l.size, l.count
	l.mu.Unlock()
	if !over {
		return func() {}
	}
	n := 2*int64(size) + int64(count)*(entryOverhead+offsetBytes)
	if l.srv.cfg.Budget.Reserve(l.srv.ctx, n) != nil {
		return func() {}
	}
	return func() { l.srv.cfg.Budget.Release(n) }
}

// finish applies the run's events, every one stored since the log's close succeeded, to its thread,
// after the run's acceptance landed.
func (l *threadRun) finish(ctx context.Context) error {
	<-l.landed
	l.mu.Lock()
	events, over := l.events, l.over
	l.mu.Unlock()
	if over {
		entries, _, err := l.srv.cfg.Store.Snapshot(ctx, l.principal, l.runID)
		if err != nil {
			return err
		}
		events = eventsOf(entries) // charged by reserveReadBack
	}
	return l.srv.cfg.Threads.FinishRun(ctx, l.principal, l.threadID, l.runID, events)
}

// charge charges the entries of a log read whole to the memory budget, and returns the
// function that gives them back once they are no longer held.
func (srv *Server) charge(entries []Entry) (release func()) {
	var n int64
	for _, e := range entries {
		n += int64(len(e.Event)+len(e.Offset)) + entryOverhead
	}
	srv.cfg.Budget.Take(n)
	return func() { srv.cfg.Budget.Release(n) }
}

// entryOverhead is what an entry of a log read whole costs beyond its bytes: the Entry, and
// the event's place in the slices built from it.
const entryOverhead = 64

// offsetBytes is what an entry's offset takes (37 bytes of text), to reserve a log's read
// before reading it.
const offsetBytes = 40

// Hydrate answers (THREADS.md section 1).
type hydrateAnswer struct {
	Messages   json.RawMessage `json:"messages"`
	ActiveRun  *runRef         `json:"activeRun"`
	Interrupts json.RawMessage `json:"interrupts"`
	Page       *pageInfo       `json:"page,omitempty"`
}

type runRef struct {
	RunID string `json:"runId"`
}

type pageInfo struct {
	Truncated bool   `json:"truncated"`
	Cursor    string `json:"cursor,omitempty"`
}

// maxPageLimit caps a hydrate's or a list's limit.
const maxPageLimit = 500

// pageLimit returns the query's limit, 0 when absent or invalid (everything, no page).
func pageLimit(r *http.Request) int {
	n, err := strconv.Atoi(r.URL.Query().Get("limit"))
	if err != nil || n <= 0 {
		return 0
	}
	return min(n, maxPageLimit)
}

// hydrate answers GET ?threadId= on the chat paths: the thread's messages, its active run and
// its pending interrupts. An unknown thread, or another principal's, is an empty one; so is a
// thread the store cannot read, since the client shows any failure as an empty chat anyway.
func (srv *Server) hydrate(w http.ResponseWriter, r *http.Request, principal, threadID string) {
	if !srv.holdHydrate(w, r, principal) {
		return
	}
	defer srv.hydrates.Put(principal)
	if !srv.cfg.Budget.Admit() {
		// A hydrate may read a whole run's log (up to max-run-bytes): none starts while
		// the gateway's memory is short.
		srv.cfg.Metrics.LimitRefused(metrics.LimitMemoryBudget)
		w.Header().Set("Retry-After", "1")
		writeJSONError(w, http.StatusServiceUnavailable, MsgMemoryBudget)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), threadTimeout)
	defer cancel()
	ans, release := srv.hydrateAnswer(ctx, principal, threadID, srv.thread(ctx, principal, threadID), pageLimit(r), r.URL.Query().Get("before"))
	defer release()
	writeJSON(w, http.StatusOK, ans)
}

// hydrateAnswer returns the page of t (nil: none, an empty thread) that limit and before
// name, with its active run's events so far, and what releases the memory they hold.
func (srv *Server) hydrateAnswer(ctx context.Context, principal, threadID string, t Thread, limit int, before string) (hydrateAnswer, func()) {
	ans := hydrateAnswer{Messages: json.RawMessage("[]"), Interrupts: json.RawMessage("null")}
	release := func() {}
	if t != nil {
		var activeRun string
		var active []json.RawMessage
		if runID := t.ActiveRun(); runID != "" {
			entries, closed, err := srv.cfg.Store.Snapshot(ctx, principal, runID)
			release = srv.charge(entries)
			switch {
			case err == nil && closed:
				// The run ended and its gateway did not finish its thread (it stopped
				// meanwhile): finish it here, as it would have.
				events := eventsOf(entries)
				if err := srv.cfg.Threads.FinishRun(ctx, principal, threadID, runID, events); err != nil {
					srv.log.Warn("hydrate: finishing an ended run", slog.String(keyRunID, runID), slog.String(keyErr, err.Error()))
				} else {
					t = srv.thread(ctx, principal, threadID) // nil: hydrated as empty
				}
			case err == nil:
				activeRun, active = runID, eventsOf(entries)
				ans.ActiveRun = &runRef{runID}
			case !errors.Is(err, ErrUnknownRun):
				srv.log.Warn("hydrate: reading the active run", slog.String(keyRunID, runID), slog.String(keyErr, err.Error()))
			}
		}
		page, err := srv.cfg.Threads.Hydrate(ctx, t, activeRun, active, limit, before)
		if err != nil {
			// The client shows a failed hydrate as an empty chat: the page answers what is
			// at hand.
			srv.log.Warn("hydrate: reading a thread's older messages", slog.String(keyErr, err.Error()))
		}
		ans.Messages, ans.Interrupts = page.Messages, page.Interrupts
		if limit > 0 {
			ans.Page = &pageInfo{Truncated: page.Cursor != "", Cursor: page.Cursor}
			if before != "" { // activeRun and interrupts matter on the first page only
				ans.ActiveRun, ans.Interrupts = nil, json.RawMessage("null")
			}
		}
	}
	return ans, release
}

// thread returns the principal's thread, nil when it has none (or threads are off, or the
// store failed: logged).
func (srv *Server) thread(ctx context.Context, principal, threadID string) Thread {
	if srv.cfg.Threads == nil || threadID == "" {
		return nil
	}
	t, err := srv.cfg.Threads.Thread(ctx, principal, threadID)
	if err != nil {
		if !errors.Is(err, ErrUnknownThread) {
			srv.log.Warn("reading a thread", slog.String(keyErr, err.Error()))
		}
		return nil
	}
	return t
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// ThreadsHandler returns the handler of GET /api/threads and DELETE /api/threads/{threadId}
// (THREADS.md section 4), the threadId in the request's path value threadId. A list holds
// the principal's threads, most recently updated first, limit at a time (?limit=N, at most
// 500, default 50) before a cursor (?before=C, a page's cursor); a delete answers 204, or 404
// for a thread the principal does not have.
func (srv *Server) ThreadsHandler() http.Handler { return http.HandlerFunc(srv.serveThreads) }

// defaultThreadPage is the default limit of a thread list.
const defaultThreadPage = 50

type threadItem struct {
	ThreadID  string  `json:"threadId"`
	Title     string  `json:"title"`
	CreatedAt string  `json:"createdAt"`
	UpdatedAt string  `json:"updatedAt"`
	ActiveRun *runRef `json:"activeRun"`
}

// admitThreads is admitJSON for an endpoint of the thread store: 404 when threads are not kept.
func (srv *Server) admitThreads(w http.ResponseWriter, r *http.Request) (string, bool) {
	principal, ok := srv.admitJSON(w, r)
	if ok && srv.cfg.Threads == nil {
		writeJSONError(w, http.StatusNotFound, "threads are not kept")
		return "", false
	}
	return principal, ok
}

func (srv *Server) serveThreads(w http.ResponseWriter, r *http.Request) {
	principal, ok := srv.admitThreads(w, r)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), threadTimeout)
	defer cancel()
	if r.Method == http.MethodDelete {
		err := srv.cfg.Threads.DeleteThread(ctx, principal, r.PathValue("threadId"))
		switch {
		case errors.Is(err, ErrUnknownThread):
			writeJSONError(w, http.StatusNotFound, "unknown thread")
		case err != nil:
			srv.log.Warn("deleting a thread", slog.String(keyErr, err.Error()))
			writeJSONError(w, http.StatusServiceUnavailable, "thread store unavailable")
		default:
			w.WriteHeader(http.StatusNoContent)
		}
		return
	}
	list, err := srv.cfg.Threads.Threads(ctx, principal)
	if err != nil {
		srv.log.Warn("listing threads", slog.String(keyErr, err.Error()))
		writeJSONError(w, http.StatusServiceUnavailable, "thread store unavailable")
		return
	}
	limit := pageLimit(r)
	if limit == 0 {
		limit = defaultThreadPage
	}
	start := 0
	if before, ok := decodeThreadCursor(r.URL.Query().Get("before")); ok {
		start, _ = slices.BinarySearchFunc(list, before, compareSummaries)
		if start < len(list) && compareSummaries(list[start], before) == 0 {
			start++
		}
	}
	end := min(start+limit, len(list))
	items := make([]threadItem, 0, end-start)
	for _, t := range list[start:end] {
		it := threadItem{ThreadID: t.ThreadID, Title: t.Title, CreatedAt: isoTime(t.Created), UpdatedAt: isoTime(t.Updated)}
		if t.ActiveRun != "" {
			it.ActiveRun = &runRef{t.ActiveRun}
		}
		items = append(items, it)
	}
	page := pageInfo{Truncated: end < len(list)}
	if page.Truncated {
		page.Cursor = encodeThreadCursor(list[end-1])
	}
	writeJSON(w, http.StatusOK, struct {
		Threads []threadItem `json:"threads"`
		Page    pageInfo     `json:"page"`
	}{items, page})
}

func isoTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z07:00") }

// compareSummaries orders threads as Threads lists them: most recently updated first, ties
// by threadId.
func compareSummaries(a, b ThreadSummary) int {
	if c := b.Updated.Compare(a.Updated); c != 0 {
		return c
	}
	return strings.Compare(a.ThreadID, b.ThreadID)
}

// A thread list's cursor is the position of the page's last thread: its update time and id.
func encodeThreadCursor(t ThreadSummary) string {
	return base64.RawURLEncoding.EncodeToString([]byte(t.Updated.UTC().Format(time.RFC3339Nano) + "\n" + t.ThreadID))
}

func decodeThreadCursor(c string) (ThreadSummary, bool) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil || c == "" {
		return ThreadSummary{}, false
	}
	at, id, ok := strings.Cut(string(b), "\n")
	if !ok {
		return ThreadSummary{}, false
	}
	ts, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return ThreadSummary{}, false
	}
	return ThreadSummary{ThreadID: id, Updated: ts}, true
}
