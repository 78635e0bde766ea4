package conversation_test

import (
	"encoding/binary"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/conversation"
)

// TestOversizedMessage: a message over the read limit closes the socket 1009, with a close
// frame the client reads, whichever way the client sends it: one frame far over the limit
// or just over, fragments that add up past it, with the handshake, while the gateway streams
// a turn to the socket, on a conversation socket or a resume socket. The client goes on
// writing its message while the gateway closes, as a client does: the gateway must not reset
// the connection under the close frame.
func TestOversizedMessage(t *testing.T) {
	const limit = conversation.DefaultReadLimit
	over := func(n int) [][]byte { return [][]byte{clientFrame(opText, true, make([]byte, n))} }
	fragments := func(size, count int) [][]byte {
		var fs [][]byte
		for i := range count {
			op := byte(opContinuation)
			if i == 0 {
				op = opText
			}
			fs = append(fs, clientFrame(op, i == count-1, make([]byte, size)))
		}
		return fs
	}
	for _, tc := range []struct {
		name string
		// open opens the socket and brings it to where the message is sent; piped: the
		// message goes with the handshake.
		open   func(t *testing.T, e *env, msg []byte) *rawClient
		frames [][]byte
	}{
		{"far over the limit, idle", idle, over(4 * limit)},
		{"just over the limit, idle", idle, over(limit + 1)},
		{"fragments over the limit, idle", idle, fragments(limit/4, 8)},
		{"far over the limit, with the handshake", piped, over(4 * limit)},
		{"far over the limit, while streaming a turn", streaming, over(4 * limit)},
		{"just over the limit, while streaming a turn", streaming, over(limit + 1)},
		{"fragments over the limit, while streaming a turn", streaming, fragments(limit/4, 8)},
		{"far over the limit, behind a backlog", backlog, over(4 * limit)},
		{"just over the limit, behind a backlog", backlog, over(limit + 1)},
		{"fragments over the limit, behind a backlog", backlog, fragments(limit/4, 8)},
		{"far over the limit, on a resume socket", resuming, over(4 * limit)},
		{"fragments over the limit, on a resume socket", resuming, fragments(limit/4, 8)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{memory: true})
			var msg []byte
			for _, f := range tc.frames {
				msg = append(msg, f...)
			}
			rc := tc.open(t, e, msg)
			if got, want := rc.closeAfterWriting(msg), "close 1009"; got != want {
				t.Errorf("socket after a message of %d bytes over %d frames: %s, want %s", len(msg), len(tc.frames), got, want)
			}
		})
	}
}

// idle opens a conversation socket that has done nothing yet.
func idle(t *testing.T, e *env, _ []byte) *rawClient { return dialRaw(t, e, nil) }

// piped opens a conversation socket with the first 64 KiB of msg in the handshake's write;
// closeAfterWriting then writes msg past them.
func piped(t *testing.T, e *env, msg []byte) *rawClient {
	rc := dialRaw(t, e, msg[:64<<10])
	rc.sent = 64 << 10
	return rc
}

// streaming opens a conversation socket that streams a long, fast turn, and reads its first
// events.
func streaming(t *testing.T, e *env, _ []byte) *rawClient {
	rc := dialRawQuery(t, e, "", nil, 8<<10)
	rc.write(clientFrame(opText, true, runFrame("streaming", script{Tokens: 5000, DeltaBytes: 200})))
	for range 10 {
		if op, _ := rc.read(); op != opText {
			t.Fatalf("frame of opcode %x while streaming, want text", op)
		}
	}
	return rc
}

// backlog opens a conversation socket whose client stopped reading while its turn streamed
// 3 MB (under the socket's queue caps): the turn's frames wait in the gateway's queue and the
// connection's buffers when the message is sent.
func backlog(t *testing.T, e *env, _ []byte) *rawClient {
	rc := dialRawQuery(t, e, "", nil, 8<<10)
	rc.write(clientFrame(opText, true, runFrame("backlog", script{Tokens: 3000, DeltaBytes: 1000})))
	e.waitClosed(t, "backlog")
	return rc
}

// resuming opens a resume socket that tails a running turn, and reads its first event.
func resuming(t *testing.T, e *env, _ []byte) *rawClient {
	cl := dial(t, e.url(), "")
	cl.send(runFrame("tailed", script{Tokens: 5, Block: true}))
	cl.untilFirst()
	t.Cleanup(func() {
		cl.send(abortFrame("tailed"))
		e.waitClosed(t, "tailed")
	})
	rc := dialRawQuery(t, e, url.Values{"runId": {"tailed"}, "offset": {"-1"}}.Encode(), nil, 0)
	if op, _ := rc.read(); op != opText {
		t.Fatalf("frame of opcode %x on the resume socket, want text", op)
	}
	return rc
}

// untilFirst reads the socket's first frame, the turn's run.accepted.
func (cl *client) untilFirst() {
	cl.t.Helper()
	if f := cl.next(20 * time.Second); f.err != nil {
		cl.t.Fatalf("socket ended before its first frame: %v", f.err)
	}
}

// closeAfterWriting writes msg (past what was sent already) and reads the server's frames
// meanwhile, and returns how the socket ended: "close <code>" for a close frame, else the
// read's error. The writes go on until they fail or msg is written, as a client's do: the
// close frame may reach it before its message is all sent.
func (rc *rawClient) closeAfterWriting(msg []byte) string {
	// The first limit+1 bytes of the message go before the client reads anything: the
	// gateway reads past its limit while its frames to the client still wait to be sent.
	p := msg[rc.sent:]
	if n := min(len(p), int(conversation.DefaultReadLimit)+16); n > 0 {
		if _, err := rc.c.Write(p[:n]); err != nil {
			return fmt.Sprintf("write: %v", err)
		}
		p = p[n:]
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for len(p) > 0 {
			n := min(len(p), 64<<10)
			if _, err := rc.c.Write(p[:n]); err != nil {
				return
			}
			p = p[n:]
		}
	}()
	defer func() {
		rc.c.Close()
		<-done
	}()
	for {
		op, payload, err := rc.readFrame()
		switch {
		case err != nil:
			return fmt.Sprintf("no close frame (%v)", err)
		case op == 0x8 && len(payload) >= 2:
			return fmt.Sprintf("close %d", binary.BigEndian.Uint16(payload))
		case op == 0x8:
			return "close frame without a code"
		}
	}
}
