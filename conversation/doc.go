// Package conversation serves the gateway's client endpoints: the WebSocket endpoint GET /ws
// (PROTOCOL.md sections 2 and 3) and the HTTP transports beside it (section 5).
//
// New builds a Server from a Config; Server.ServeHTTP upgrades a request to a socket and
// serves it until it closes; Server.HTTPHandler(SSE or NDJSON) returns the HTTP transport;
// Server.Shutdown closes every socket and drains the turns.
//
// Both transports share one turn-starting path and one replay path, so a turn started on
// either is the same turn in the same log: Server.startTurn (turns.go) takes a valid
// RunAgentInput through the resubmit rule, the log's creation (Store.Create, which refuses
// another principal's runId) and turn.Start; Server.replay (resume.go) reads a log strictly
// after an offset until the log is closed, retrying transient read failures after the last
// offset sent. Config.Principal (or Config.Tokens) authenticates both transports.
//
// A request without an offset query parameter becomes a conversation socket: text frames
// are abort frames, auth frames or run frames (protocol.DecodeClientFrame). A run frame starts a turn
// (package turn) whose envelopes are delivered to this socket; an abort frame stops the turn
// of its runId, and an abort that arrives before its run frame is remembered in a per-socket
// set capped at Config.EarlyAborts entries and Config.EarlyAbortTTL of age. A run frame for a
// runId whose turn is active on the socket aborts that turn, waits for it to end, then starts
// again (a resubmit). Frames that are not JSON are dropped and counted, binary frames are
// ignored, an invalid run frame is answered with a bare RUN_ERROR (code invalid_input), a
// runId of another principal with a bare RUN_ERROR (code forbidden), and a run log that
// cannot be created with a bare RUN_ERROR (code log_unavailable). Turns outlive their socket:
// they go on into their logs, and the client resumes from there (Config.AbortOnDisconnect
// restores abort-on-disconnect).
//
// Per-socket and per-principal limits, each answered clearly: a run frame for a new runId
// while Config.MaxTurnsPerSocket turns run on the socket gets a bare RUN_ERROR (code
// limit_exceeded, "max-socket-turns: ...") and creates no log (a resubmit is allowed); run
// frames beyond a token bucket of Config.RunFrameRate per second and Config.RunFrameBurst
// (two fields of the socket, refilled when a run frame arrives: no timer) get a bare
// RUN_ERROR (code limit_exceeded, "run-frame-rate: ...") and are ignored, aborts are not
// counted; a principal that holds Config.MaxSocketsPerPrincipal conversation sockets, resume
// sockets and HTTP streams is refused 429 (MsgTooManySockets) before the upgrade, counted in
// one map entry per principal and released when the socket or stream ends. The socket stays
// open after every refusal.
//
// A request with an offset query parameter becomes a resume socket: it replays the run's log
// strictly after the offset, tails it until the log is closed, then closes 1000. Inbound
// frames are ignored. Close codes:
//
//	1000                          replayed up to the log's close; also "idle" (heartbeat)
//	1008 "no resume offset"       offset present but empty
//	1008 "invalid runId"          runId missing, empty, too long, or not printable UTF-8
//	1008 "invalid offset"         offset malformed, from another run, or from a recreated log
//	4404 "unknown or expired run" no such run for the principal
//	1011 "resume failed"          the log could not be read
//	1012 "service restart"        Shutdown (every socket)
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
// HTTP transport (http.go): the path chooses the framing, since the reference clients'
// SSE and NDJSON adapters send identical requests. SSE writes "id: <offset>" and
// "data: <event>" lines, NDJSON one envelope {"id":"<offset>","chunk":<event>} per line; a
// bare event (invalid input, forbidden, log unavailable) has no id. Requests:
//
//	POST, RunAgentInput body          starts the turn as a run frame does and streams it live;
//	                                  the turn outlives the response (X-Run-Id, when sent, must
//	                                  equal the body's runId)
//	POST with Last-Event-ID           a resume: replays the log of X-Run-Id (else the body's
//	                                  runId) strictly after the offset; no agent runs
//	GET ?runId=&offset=               replays and tails (offset: minted, -1 or now;
//	                                  Last-Event-ID wins over it)
//
// A response ends when the log is closed. Refusals: 400 (body not JSON, an abort or auth frame,
// X-Run-Id mismatch, missing or bad runId or offset; without any offset the message says
// what is expected), 401 (Config.Principal failed), 429 (Config.MaxSocketsPerPrincipal), 403 (an Origin header of another host
// that no Config.OriginPatterns entry matches), 404 (unknown or expired run, or another
// principal's), 405, 413 (body over Config.ReadLimit), 503 (Shutdown began). An invalid
// RunAgentInput or another principal's runId is answered as on a socket: a 200 stream
// holding one bare RUN_ERROR (code invalid_input or forbidden). Heartbeats come from the
// same wheel (SSE ": ping" comments, blank NDJSON lines); a stream whose writes stall for the
// pong timeout ends. A live stream's queue has the socket's caps; a turn's frame that does
// not fit stops live delivery and the stream continues from the log after the last offset
// it queued (counted as a slow_consumer drop), so a slow client is never cut. Shutdown ends
// replaying streams at once and lets live ones follow their turn to its end (drained, or
// stopped with RUN_ERROR code shutdown). HTTP turns are keyed by principal and runId for
// the resubmit rule; Config.AbortOnDisconnect aborts a POST's turn when its client leaves.
//
// A peer that does not answer a protocol ping within the pong timeout is dropped without a
// close handshake (it would not answer one either).
//
// Each socket has one reader (a goroutine the Server starts after the upgrade, so that
// net/http's goroutine and handshake buffers are freed; on Unix, over plain TCP, an idle
// reader waits for input outside coder/websocket with a 2 KiB stack, and a conversation
// socket's reader moves to a new goroutine after each frame it reads: idle.go), and one writer
// goroutine started on demand when a frame is queued, which exits when the queue is empty, and
// also performs the close. The outbound queue is bounded (Config.QueueSize frames and
// Config.QueueBytes bytes): on a conversation socket a turn's frame that does not fit closes
// the socket with 1013 "slow consumer" (the turn goes on into its log; the client resumes from
// it); a ping that does not fit is dropped and counted; a resume socket's replay waits for
// room instead (the log is its buffer). Pings, dead-peer detection and idle closes come from
// one shared heartbeat.Wheel, so an idle socket holds no goroutine, timer or queue besides its
// reader, and reads through a 128-byte buffer and writes through a 64-byte one. The writer
// sends each batch of queued frames with one system call per 32 KiB, under one write deadline.
package conversation
