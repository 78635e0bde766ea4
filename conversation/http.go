package conversation

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/wsgateway/wsgateway/heartbeat"
	"github.com/wsgateway/wsgateway/internal/origin"
	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/turn"
)

// Framing is how an HTTP stream writes events (PROTOCOL.md section 5).
type Framing int

const (
	// SSE writes server-sent events: "id: <offset>\ndata: <event>\n\n" (a bare event has no
	// id line); heartbeats are the comment ": ping\n\n". Content-Type text/event-stream.
	SSE Framing = iota + 1
	// NDJSON writes one envelope {"id":"<offset>","chunk":<event>} per line (a bare event
	// as it is); heartbeats are blank lines, which NDJSON readers skip. Content-Type
	// application/x-ndjson.
	NDJSON
	// AGUI writes server-sent events as SSE does, for AG-UI's own HTTP transport
	// (@ag-ui/client's HttpAgent), whose verifier wants RUN_STARTED (or RUN_ERROR) first: the
	// gateway's run.accepted marker is not written, though the log keeps it and its offset
	// still counts as sent. Content-Type text/event-stream.
	AGUI
)

// Request headers of the HTTP transport.
const (
	HeaderRunID       = "X-Run-Id"      // the runId of a POST
	HeaderLastEventID = "Last-Event-ID" // the offset a resume continues after
)

// Messages of the 400 answers of the HTTP transport.
const (
	MsgNoOffset = "a Last-Event-ID header or an offset query parameter is expected (an offset the gateway sent, -1 for the whole run, or now)"
	MsgNoRunID  = "a runId is expected (X-Run-Id header of a POST, runId query parameter of a GET or DELETE)"
	// MsgAbortFrame answers an abort frame POSTed as a body.
	MsgAbortFrame = "abort frames are accepted on a conversation socket only; over HTTP, DELETE ?runId= aborts a turn"
)

var (
	sseContentType    = "text/event-stream"
	ndjsonContentType = "application/x-ndjson"
	ssePing           = []byte(": ping\n\n")
	ndjsonPing        = []byte("\n")
)

// HTTPHandler returns the HTTP transport with framing f: POST starts a turn (or, with
// Last-Event-ID, resumes one) and streams it; GET replays a run; DELETE ?runId= aborts the
// principal's running turn of runId. See the package doc.
func (s *Server) HTTPHandler(f Framing) http.Handler {
	if f != SSE && f != NDJSON && f != AGUI {
		panic("conversation: unknown Framing")
	}
	return httpHandler{s, f}
}

type httpHandler struct {
	srv     *Server
	framing Framing
}

func (h httpHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost && r.Method != http.MethodGet && r.Method != http.MethodDelete {
		w.Header().Set("Allow", "GET, POST, DELETE")
		http.Error(w, "method not allowed: POST starts or resumes a turn, GET replays a run, DELETE aborts one", http.StatusMethodNotAllowed)
		return
	}
	srv := h.srv
	principal, err := srv.cfg.Principal(r)
	if err != nil {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	if !srv.originAllowed(r) {
		http.Error(w, "origin not allowed", http.StatusForbidden)
		return
	}
	if r.Method == http.MethodDelete {
		h.abort(w, r, principal)
		return
	}
	// A GET with runId is a join; one with a threadId and no runId is a hydrate.
	if q := r.URL.Query(); r.Method == http.MethodGet && !q.Has("runId") && q.Has("threadId") {
		srv.hydrate(w, r, principal, q.Get("threadId"))
		return
	}
	if !srv.hold(principal) {
		srv.refuseHold(w, r)
		return
	}
	defer srv.release(principal)
	if !srv.beginConn() {
		http.Error(w, "service restart", http.StatusServiceUnavailable)
		return
	}
	defer srv.connWG.Done()
	log := srv.log.With(slog.String(keyKind, "http"), slog.String(keyRemote, r.RemoteAddr))
	kind := metrics.SocketConversation
	if r.Method == http.MethodGet || r.Header.Get(HeaderLastEventID) != "" {
		kind = metrics.SocketResume
	}
	srv.cfg.Metrics.SocketOpened(h.transport(), kind)
	defer srv.cfg.Metrics.SocketClosed(h.transport(), kind)

	if r.Method == http.MethodGet {
		offset := r.Header.Get(HeaderLastEventID)
		if offset == "" {
			offset = r.URL.Query().Get("offset")
		}
		h.replay(w, r, principal, r.URL.Query().Get("runId"), offset, log)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, srv.cfg.ReadLimit))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
		} else {
			http.Error(w, "reading the request body failed", http.StatusBadRequest)
		}
		return
	}
	if offset := r.Header.Get(HeaderLastEventID); offset != "" {
		runID := r.Header.Get(HeaderRunID)
		if runID == "" {
			if in, err := protocol.DecodeRunAgentInput(body); err == nil {
				runID = in.RunID
			}
		}
		h.replay(w, r, principal, runID, offset, log)
		return
	}
	f, err := protocol.DecodeClientFrame(body)
	switch {
	case errors.Is(err, protocol.ErrNotJSON):
		http.Error(w, "the request body is not JSON: a RunAgentInput is expected", http.StatusBadRequest)
		return
	case err == nil && f.Kind == protocol.FrameAbort:
		http.Error(w, MsgAbortFrame, http.StatusBadRequest)
		return
	case err == nil && f.Kind != protocol.FrameRun:
		http.Error(w, "auth frames are accepted on a conversation socket only", http.StatusBadRequest)
		return
	case err == nil && r.Header.Get(HeaderRunID) != "" && r.Header.Get(HeaderRunID) != f.RunID:
		http.Error(w, "the X-Run-Id header differs from the body's runId", http.StatusBadRequest)
		return
	}
	st := h.newStream(w, r, log)
	defer st.close()
	if err != nil {
		st.pushBare(protocol.AppendRunError(nil, err.Error(), CodeInvalidInput))
		st.end()
		st.writeLoop(r.Context())
		return
	}
	h.live(st, r, principal, f.Input)
}

// originAllowed applies the gateway's origin rule (origin.Allowed) to a browser's request,
// with Config.OriginPatterns.
func (s *Server) originAllowed(r *http.Request) bool {
	return origin.Allowed(r, s.cfg.OriginPatterns)
}

// live starts the turn of in, streams it live and, if live delivery overflowed, from the log.
func (h httpHandler) live(st *httpStream, r *http.Request, principal string, in *protocol.RunAgentInput) {
	srv := h.srv
	s, prev, err := srv.turns.add(runKey{principal, in.RunID}, srv.cfg.Store.ThreadKey(principal, in.ThreadID), nil, 0, 0)
	var refused *limitError
	if errors.As(err, &refused) {
		srv.refuseStart(st.w, r, refused, false) // the stream was not opened: nothing was written
		return
	}
	if err != nil {
		st.endWith(metrics.ResumeInterrupted) // shutting down: 503, the client retries elsewhere
		st.writeLoop(r.Context())
		return
	}
	st.open()
	t, failure := srv.startTurn(turnRequest{slot: s, prev: prev, in: in, values: srv.turnContext(r), sink: st, log: st.log})
	if t == nil && s.busyWith != "" {
		writeThreadBusy(st.w, s.busyWith) // nothing was written: the refusal is the response
		return
	}
	if t == nil {
		if failure != nil {
			st.pushBare(failure)
		}
		st.end()
		st.writeLoop(r.Context())
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer st.end()
		select {
		case <-t.Done():
		case <-st.overflowed:
		case <-ctx.Done():
			return
		}
		// The rest comes from the log when the client could not keep up with the turn, and
		// when another request aborted it (a DELETE, a resubmit): an aborted turn delivers
		// nothing more live, and this response ends with the log's RUN_ERROR all the same.
		if after, ok := st.overflowAt(); ok || srv.turns.aborted(s) {
			t.Detach()
			if after == "" {
				after = "-1" // aborted before its first event: the whole log
			}
			srv.replay(st.replayCtx(ctx), principal, in.RunID, after, st.log, nil, st.send)
		}
	}()
	err = st.writeLoop(ctx)
	cancel()
	wg.Wait()
	t.Detach() // the turn goes on into its log only
	// The client left when a write failed, or when its request's context ended: the writer
	// may have seen the stream ended (by the goroutine above, on the same cancellation) first.
	if (err != nil || r.Context().Err() != nil) && srv.cfg.AbortOnDisconnect {
		srv.turns.abortSlot(s)
	}
}

// abort answers DELETE ?runId= as POST /api/runs/{runId}/abort (Server.AbortHandler).
func (h httpHandler) abort(w http.ResponseWriter, r *http.Request, principal string) {
	runID := r.URL.Query().Get("runId")
	if runID == "" {
		writeJSONError(w, http.StatusBadRequest, MsgNoRunID)
		return
	}
	h.srv.answerAbort(w, r, principal, runID)
}

// transport returns the metrics label of the handler's framing.
func (h httpHandler) transport() metrics.Transport {
	switch h.framing {
	case NDJSON:
		return metrics.TransportNDJSON
	case AGUI:
		return metrics.TransportAGUI
	}
	return metrics.TransportSSE
}

// replay streams runID's log strictly after offset through the one replay path.
func (h httpHandler) replay(w http.ResponseWriter, r *http.Request, principal, runID, offset string, log *slog.Logger) {
	reason := checkResume(runID, offset)
	if runID == "" || reason != "" {
		h.srv.cfg.Metrics.Resume(h.transport(), metrics.ResumeBadRequest)
	}
	switch {
	case runID == "":
		http.Error(w, MsgNoRunID, http.StatusBadRequest)
		return
	case reason == "no resume offset":
		http.Error(w, MsgNoOffset, http.StatusBadRequest)
		return
	case reason != "":
		http.Error(w, reason, http.StatusBadRequest)
		return
	}
	st := h.newStream(w, r, log)
	defer st.close()
	ctx, cancel := context.WithCancel(h.srv.withRemoteParent(r.Context(), r.Header))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		res := h.srv.replay(st.replayCtx(ctx), principal, runID, offset, st.log, st.open, st.send)
		h.srv.cfg.Metrics.Resume(h.transport(), res)
		st.endWith(res)
	}()
	st.writeLoop(ctx)
	cancel()
	wg.Wait()
}

// httpStream is one streaming HTTP response. Producers (a turn's Deliver, a replay's send,
// the heartbeat's Ping) queue framed bytes; the handler's goroutine writes them (writeLoop).
type httpStream struct {
	srv     *Server
	w       http.ResponseWriter
	rc      *http.ResponseController
	framing Framing
	log     *slog.Logger
	hb      *heartbeat.Entry

	wake       chan struct{} // buffered 1: the writer has work
	overflowed chan struct{} // closed when live delivery overflowed

	mu       sync.Mutex
	queue    []frame
	queued   int
	room     chan struct{}        // closed when the writer takes the queue
	opened   bool                 // the response is a stream: write 200 and the headers
	header   bool                 // the header is written
	overflow bool                 // live delivery stopped after last
	last     string               // offset of the last event queued
	ended    bool                 // no more frames: end once the queue is written
	result   metrics.ResumeResult // of a replay that ended before opening
	dead     bool                 // a ping went unwritten for the pong timeout, or a write failed
	stop     context.CancelFunc   // of the replay, for Shutdown
	stopped  bool
}

func (h httpHandler) newStream(w http.ResponseWriter, r *http.Request, log *slog.Logger) *httpStream {
	st := &httpStream{
		srv:        h.srv,
		w:          w,
		rc:         http.NewResponseController(w),
		framing:    h.framing,
		log:        log,
		wake:       make(chan struct{}, 1),
		overflowed: make(chan struct{}),
	}
	// A stream outlives the server's read timeout: without this, net/http's background read
	// would cancel the request's context when it expires.
	st.rc.SetReadDeadline(time.Time{})
	st.hb = h.srv.wheel.Add(st)
	st.hb.TurnStarted() // a stream ends with its log, never for idleness
	h.srv.mu.Lock()
	h.srv.streams[st] = struct{}{}
	st.stopped = h.srv.closing // Shutdown began after beginConn: a replay ends at once
	h.srv.mu.Unlock()
	return st
}

// close releases the stream once its writer returned.
func (st *httpStream) close() {
	st.mu.Lock()
	st.srv.cfg.Budget.Release(int64(st.queued))
	st.queue, st.queued, st.dead = nil, 0, true
	st.mu.Unlock()
	st.hb.Remove()
	st.srv.mu.Lock()
	delete(st.srv.streams, st)
	st.srv.mu.Unlock()
}

// replayCtx returns ctx, cancelled as well when Shutdown stops the stream: a replay ends
// at once (the client resumes elsewhere), whereas a live turn is drained.
func (st *httpStream) replayCtx(ctx context.Context) context.Context {
	ctx, cancel := context.WithCancel(ctx)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.stopped {
		cancel()
	}
	st.stop = cancel
	return ctx
}

// shutdown stops a replay of the stream (Server.Shutdown).
func (st *httpStream) shutdown() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.stopped = true
	if st.stop != nil {
		st.stop()
	}
}

func (st *httpStream) signal() {
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// open makes the response a 200 stream, even before its first event.
func (st *httpStream) open() {
	st.mu.Lock()
	st.opened = true
	st.mu.Unlock()
	st.signal()
}

// end lets the writer end the response once the queue is written.
func (st *httpStream) end() { st.endWith("") }

// endWith ends the stream with a replay's result, which answers a replay that never opened.
func (st *httpStream) endWith(r metrics.ResumeResult) {
	st.mu.Lock()
	st.ended, st.result = true, r
	st.mu.Unlock()
	st.signal()
}

// overflowAt reports whether live delivery overflowed, and after which offset the log
// must be read.
func (st *httpStream) overflowAt() (string, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.last, st.overflow
}

// format frames an event; offset "" means a bare event.
func (st *httpStream) format(offset string, event []byte) []byte {
	if st.framing == NDJSON {
		var b []byte
		if offset == "" {
			b = append(make([]byte, 0, len(event)+1), event...)
		} else {
			b = protocol.AppendEnvelope(make([]byte, 0, len(event)+len(offset)+20), offset, event)
		}
		return append(b, '\n')
	}
	b := make([]byte, 0, len(event)+len(offset)+16)
	if offset != "" {
		b = append(b, "id: "...)
		b = append(b, offset...)
		b = append(b, '\n')
	}
	b = append(b, "data: "...)
	b = append(b, event...)
	return append(b, '\n', '\n')
}

// skips reports whether the stream leaves event out: the run.accepted marker and run.queued,
// on AGUI, whose verifier wants RUN_STARTED first.
func (st *httpStream) skips(event []byte) bool {
	return st.framing == AGUI && (bytes.Equal(event, runAccepted) || protocol.IsRunQueued(event))
}

// runAccepted is the marker event as the log stores it.
var runAccepted = protocol.RunAccepted().JSON()

// Deliver queues a live frame of the turn without blocking (turn.Sink). A frame that does
// not fit stops live delivery: the rest of the turn is then read from its log.
func (st *httpStream) Deliver(offset string, event []byte, emitted time.Time) {
	b := st.format(offset, event)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.overflow || st.ended || st.dead {
		return
	}
	if st.skips(event) {
		st.last = offset // left out, but sent as far as a continuation from the log goes
		return
	}
	if !st.roomLocked(len(b)) {
		st.overflow = true
		close(st.overflowed)
		st.srv.cfg.Metrics.FrameDropped(metrics.DropSlowConsumer)
		st.log.Debug("slow HTTP client: continuing from the log", slog.Int(keyQueued, len(st.queue)), slog.Int(keyBytes, st.queued))
		return
	}
	st.pushLocked(frame{data: b, emitted: emitted})
	if offset != "" {
		st.last = offset
	}
}

// pushBare queues a bare event regardless of the caps (the one event of a failed start).
func (st *httpStream) pushBare(event []byte) {
	b := st.format("", event)
	st.mu.Lock()
	st.pushLocked(frame{data: b})
	st.mu.Unlock()
}

// send queues a replayed event, waiting for room, and for room in the gateway's memory
// budget (the log is the buffer).
func (st *httpStream) send(ctx context.Context, offset string, event []byte) error {
	if st.skips(event) {
		return nil
	}
	if err := st.srv.cfg.Budget.Wait(ctx, nil, st.srv.cfg.Budget.Room); err != nil {
		return err
	}
	b := st.format(offset, event)
	for {
		st.mu.Lock()
		if st.dead || st.ended {
			st.mu.Unlock()
			return errSocketClosed
		}
		if st.roomLocked(len(b)) {
			st.pushLocked(frame{data: b})
			st.mu.Unlock()
			return nil
		}
		if st.room == nil {
			st.room = make(chan struct{})
		}
		room := st.room
		st.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (st *httpStream) roomLocked(n int) bool {
	if len(st.queue) == 0 {
		return true
	}
	return len(st.queue) < st.srv.cfg.QueueSize && st.queued+n <= st.srv.cfg.QueueBytes && !st.srv.cfg.Budget.Full()
}

// pushLocked queues f, charged to the memory budget until it is written or dropped.
func (st *httpStream) pushLocked(f frame) {
	st.queue = append(st.queue, f)
	st.queued += len(f.data)
	st.srv.cfg.Budget.Take(int64(len(f.data)))
	st.opened = true
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// Ping queues a heartbeat (heartbeat.Peer); its write counts as the pong. A full queue
// skips it: the writer is busy, which is a heartbeat of its own.
func (st *httpStream) Ping() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended || st.dead {
		return
	}
	if !st.roomLocked(len(ssePing)) {
		st.srv.cfg.Metrics.FrameDropped(metrics.DropPingQueue)
		return
	}
	p := ssePing
	if st.framing == NDJSON {
		p = ndjsonPing
	}
	st.pushLocked(frame{data: p})
}

// Expire ends a stream whose writes stalled for the pong timeout (heartbeat.Peer).
func (st *httpStream) Expire(r heartbeat.Reason) {
	st.mu.Lock()
	st.dead = true
	st.mu.Unlock()
	st.log.Debug("heartbeat close", slog.String(keyReason, r.String()))
	st.signal()
}

// errStreamEnded reports a stream that ended before its producer did: the client left, a
// write failed, or its writes stalled.
var errStreamEnded = errors.New("conversation: HTTP stream ended")

// writeLoop writes the queue until the producer ended it (nil) or the stream failed.
func (st *httpStream) writeLoop(ctx context.Context) error {
	for {
		st.mu.Lock()
		batch, size := st.queue, int64(st.queued)
		st.queue, st.queued = nil, 0
		if st.room != nil {
			close(st.room)
			st.room = nil
		}
		opened, header, ended, dead, result := st.opened, st.header, st.ended, st.dead, st.result
		st.header = st.header || opened
		st.mu.Unlock()
		if dead {
			return errStreamEnded
		}
		if !header && !opened && ended {
			st.refuse(result)
			return nil
		}
		if !header && opened {
			st.writeHeader()
		}
		if len(batch) > 0 || (!header && opened) {
			err := st.write(batch)
			st.srv.cfg.Budget.Release(size) // held until written
			if err != nil {
				st.mu.Lock()
				st.dead = true
				st.mu.Unlock()
				st.log.Debug("HTTP stream write", slog.String(keyErr, err.Error()))
				return errStreamEnded
			}
			continue
		}
		if ended {
			return nil
		}
		select {
		case <-st.wake:
		case <-ctx.Done():
			st.mu.Lock()
			st.dead = true
			st.mu.Unlock()
			return errStreamEnded
		}
	}
}

func (st *httpStream) writeHeader() {
	h := st.w.Header()
	if st.framing == NDJSON {
		h.Set("Content-Type", ndjsonContentType)
	} else {
		h.Set("Content-Type", sseContentType)
	}
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // reverse proxies must not buffer the stream
	st.w.WriteHeader(http.StatusOK)
}

// write writes frames and flushes them within Config.WriteTimeout.
func (st *httpStream) write(batch []frame) error {
	st.rc.SetWriteDeadline(time.Now().Add(st.srv.cfg.WriteTimeout))
	for _, f := range batch {
		if _, err := st.w.Write(f.data); err != nil {
			return err
		}
	}
	if err := st.rc.Flush(); err != nil {
		return err
	}
	st.hb.Pong()
	for _, f := range batch {
		if !f.emitted.IsZero() {
			st.srv.cfg.Metrics.Delivered(time.Since(f.emitted))
		}
	}
	return nil
}

// refuse answers a replay that ended before the log could be opened.
func (st *httpStream) refuse(r metrics.ResumeResult) {
	switch r {
	case metrics.ResumeBadRequest:
		http.Error(st.w, "invalid offset", http.StatusBadRequest)
	case metrics.ResumeUnknownRun:
		http.Error(st.w, "unknown or expired run", http.StatusNotFound)
	case metrics.ResumeInterrupted:
		http.Error(st.w, "service restart", http.StatusServiceUnavailable)
	default:
		http.Error(st.w, "resume failed", http.StatusInternalServerError)
	}
}

var _ turn.Sink = (*httpStream)(nil)
