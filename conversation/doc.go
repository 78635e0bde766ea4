// Package conversation serves the gateway's client endpoints: the WebSocket endpoint GET /ws
// (PROTOCOL.md sections 2 and 3) and the HTTP transports beside it (sections 5 and 6).
//
// New builds a Server from a Config; Server.ServeHTTP upgrades a request to a socket and
// serves it until it closes; Server.HTTPHandler(SSE, NDJSON or AGUI) returns the HTTP
// transport; Server.AbortHandler stops a run from anywhere; Server.ThreadRunsHandler starts a
// turn of a thread without a socket; Server.BranchHandler switches a thread's active branch; Server.Shutdown closes every
// socket and drains the turns. Config.Principal (or Config.Tokens) authenticates every
// request.
//
// The Server reaches storage through the interfaces it declares, in value types and errors
// of its own: Store (the run logs: RunStore adapts a *jetstream.Store; RunLog, LogReader,
// Entry, RunInfo, Takeover, Announcement; ErrForbidden, ErrUnknownRun, ErrInvalidOffset) and
// Threads (ThreadStore adapts a *threadstore.Store; Thread, ThreadAhead, Overlap,
// ThreadSummary, HydratePage, RunEvents, Window; ErrUnknownThread, ErrThreadLimit,
// ErrUnknownMessage, *BusyError). Its tests run on NATS where the logs and threads are the
// point, and on an in-memory Store and Threads where they are not (frames, heartbeats,
// per-socket limits, a thread's turns on one gateway).
//
// # Turns and replays
//
// Both transports share one turn-starting path and one replay path, so a turn started on
// either is the same turn in the same log. Server.startTurn (turns.go) takes a valid
// RunAgentInput through the resubmit rule, the log's creation (Store.Create, which refuses
// another principal's runId) and turn.Start. Server.replay (resume.go) reads a log strictly
// after an offset until the log is closed, reopening it after the last offset sent when a
// read fails. The Server's registry (turns.go) holds every turn from its run frame (or POST)
// to its end, keyed by principal and runId: a run frame for a runId that is running aborts
// that turn, waits for it to end, then starts again (a resubmit); an abort frame stops the
// principal's turn of its runId, and one that arrives before its run frame is remembered by
// its socket (Config.EarlyAborts entries, Config.EarlyAbortTTL of age). Turns outlive their
// socket and go on into their logs (Config.AbortOnDisconnect aborts them instead).
//
// # Conversation and resume sockets
//
// A request without an offset query parameter becomes a conversation socket: its text
// frames are run frames, abort frames or auth frames (protocol.DecodeClientFrame). Frames that are not
// JSON are dropped and counted, binary frames ignored. A run frame that cannot start a turn
// is answered with a bare RUN_ERROR and the socket stays open: code invalid_input (invalid
// frame), forbidden (another principal's runId), log_unavailable (the log cannot be
// created), limit_exceeded (MsgTooManyTurns beyond Config.MaxTurnsPerSocket, MsgRunFrameRate
// beyond a token bucket of Config.RunFrameRate per second and Config.RunFrameBurst). After
// such a refusal by a bound the socket reads its next frame Config.RefusalDelay later, and a
// 429 of a bound is answered after it (quota.Pause).
//
// A request with an offset query parameter becomes a resume socket: it replays the run's log
// strictly after the offset, tails it until the log is closed, then closes 1000. Inbound
// frames are ignored, but for abort frames, handled as on a conversation socket. Close codes:
//
//	1000                          replayed up to the log's close; also "idle" (heartbeat)
//	1008 "no resume offset"       offset present but empty
//	1008 "invalid runId"          runId missing, empty, too long, or not printable UTF-8
//	1008 "invalid offset"         offset malformed, from another run, or from a recreated log
//	4404 "unknown or expired run" no such run for the principal
//	1011 "resume failed"          the log could not be read
//	1012 "service restart"        Shutdown (every socket)
//	1012 "run moved"              a turn of the socket lost its log's lease: another gateway
//	                              took the run over (or reaped it); reconnect and resume
//	1013 "slow consumer"          the outbound queue overflowed (conversation sockets)
//	4401 "token expired"          the token's expiry passed (conversation sockets, Config.Tokens)
//
// With Config.Tokens, a conversation socket's principal expires with its token (authframe.go):
// the expiry is a deadline of the socket's heartbeat.Entry (no timer of its own), which the
// wheel turns into the 4401 close; a frame read after it closes the socket at once, so no turn
// starts on an expired principal. An auth frame with a valid token of the same principal moves
// the deadline and is answered with a bare CUSTOM auth.accepted; another principal's token gets
// a bare RUN_ERROR (code forbidden), an invalid one (code unauthorized), and change nothing.
// Turns outlive the close as they outlive any other.
//
// A principal holding Config.MaxSocketsPerPrincipal sockets and HTTP streams is refused 429
// (MsgTooManySockets) before the upgrade.
//
// # Following threads
//
// A follow frame makes a conversation socket follow a thread of its principal (follow.go):
// the Server's hub subscribes once per thread key that any of its sockets follows
// (Store.SubscribeThread) and fans the announcements out; after subscribing, the follow asks
// every gateway for the thread's running runs (Store.QueryThread, answered from the registry:
// runningRuns). Each run named is read from its log's start through the one replay path, on a
// goroutine of the follow, and queued as envelopes with the runId (1013 when the queue
// overflows); runs being read, and those read while the query is open, are not read twice,
// and an announcement names the socket that started the run (its origin), which skips it.
// startTurn announces every run once its log exists (Store.Announce). A follow beyond
// Config.MaxFollowsPerSocket is answered with a bare RUN_ERROR limit_exceeded
// (MsgTooManyFollows). ThreadRunsHandler starts a turn without a socket, into its log only.
//
// An abort names the socket that sent it (its origin, also across gateways): a turn aborted
// from elsewhere delivers nothing more live, so when it ends the socket that started it is
// sent the rest of its log after the last offset its sink delivered (ownSink, catchUp).
//
// # HTTP transport
//
// The path chooses the framing (http.go): SSE writes "id: <offset>" and "data: <event>"
// lines, NDJSON one envelope {"id":"<offset>","chunk":<event>} per line; a bare event has no
// id. POST with a RunAgentInput body starts a turn and streams it live; POST with
// Last-Event-ID, and GET ?runId=&offset=, replay the log (Last-Event-ID wins over offset).
// A response ends when the log is closed. A live stream whose client falls behind its queue
// continues from the log after the last offset it queued, so a slow client is never cut.
// Refusals are 400 (also for an abort or auth frame), 401, 403 (an Origin that the socket would refuse), 404, 405, 413, 429
// and 503; an invalid RunAgentInput or another principal's runId is a 200 stream holding one
// bare RUN_ERROR, as on a socket. DELETE ?runId= answers as AbortHandler (abort.go); since
// the abort comes from another request, the turn's open HTTP streams go on from the log to
// its RUN_ERROR.
//
// With Config.Threads, every run is recorded in its thread (threads.go): as accepted while
// its first event is stored, which is delivered (and the run announced to the thread's
// followers) once the thread is written, and finished from its log once the log is closed
// (threadRun, the turn's Config.Thread). A GET with a
// threadId and no runId on an HTTP transport is a hydrate: the thread's messages, active run
// and pending interrupts as JSON (an unknown or foreign thread is an empty one);
// Server.ThreadsHandler lists and deletes a principal's threads. A run that would start a
// thread beyond the principal's (threadstore.Config.MaxThreadsPerPrincipal) ends RUN_ERROR code
// limit_exceeded (MsgTooManyThreads) right after its run.accepted, in no thread.
//
// With a usage ledger (Config.Usage, package usage), every turn records its run's usage once
// its terminal is stored, a turn whose principal used its token budget ends RUN_ERROR code
// budget_exceeded before its agent is called, and Server.UsageHandler answers GET /api/usage.
//
// AGUI is the framing of AG-UI's own HTTP transport (@ag-ui/client's HttpAgent): SSE without
// the run.accepted marker, so that a stream starts with RUN_STARTED, or with the bare
// RUN_ERROR of a refused start, both of which the client's verifier accepts first. The log
// keeps the marker and its offset counts as sent: a replay from -1 starts at RUN_STARTED.
//
// # Goroutines and memory
//
// Each socket has one reader goroutine, which the Server starts after the upgrade so that
// net/http's goroutine and handshake buffers are freed (over plain TCP an idle reader waits
// outside coder/websocket: on Linux it is no goroutine, parked in the poller until input
// arrives, elsewhere on Unix a goroutine with a small stack: idle.go), and one writer
// goroutine started on demand when a frame is queued, which exits when the queue is empty
// and also performs the close. The outbound queue is bounded (Config.QueueSize frames,
// Config.QueueBytes bytes): a turn's frame that does not fit closes a conversation socket
// 1013 "slow consumer", a ping that does not fit is dropped and counted, a replay waits for
// room (the log is its buffer). Pings, dead-peer detection and idle closes come from one
// shared heartbeat.Wheel, so an idle socket holds no timer or queue besides its reader. A
// peer that does not answer a ping within the pong timeout is dropped without a close
// handshake.
package conversation
