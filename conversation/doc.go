// Package conversation serves the gateway's WebSocket endpoint, GET /ws (PROTOCOL.md
// sections 2 and 3).
//
// New builds a Server from a Config; Server.ServeHTTP upgrades a request to a socket and
// serves it until it closes; Server.Shutdown closes every socket and drains the turns.
//
// A request without an offset query parameter becomes a conversation socket: text frames
// are abort frames or run frames (protocol.DecodeClientFrame). A run frame starts a turn
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
//
// A peer that does not answer a protocol ping within the pong timeout is dropped without a
// close handshake (it would not answer one either).
//
// Each socket has one reader (a goroutine the Server starts after the upgrade, so that
// net/http's goroutine and handshake buffers are freed), and one writer goroutine started on
// demand when a frame is queued, which exits when the queue is empty, and also performs the
// close. The outbound queue is bounded (Config.QueueSize frames and Config.QueueBytes
// bytes): on a conversation socket a turn's frame that does not fit closes the socket with
// 1013 "slow consumer" (the turn goes on into its log; the client resumes from it); a ping
// that does not fit is dropped and counted; a resume socket's replay waits for room instead
// (the log is its buffer). Pings, dead-peer detection and idle closes come from one shared
// heartbeat.Wheel, so an idle socket holds no goroutine, timer or queue besides its reader,
// and reads and writes through 512-byte buffers.
package conversation
