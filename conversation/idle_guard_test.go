//go:build unix && !plainreader

package conversation_test

import (
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/conversation"
	"github.com/wsgateway/wsgateway/heartbeat"
)

// TestIdleReaderParks is the guard of idle.go's technique against an upgrade of
// coder/websocket: a socket idle after a text frame and a ping (whose control frame
// callback parks the reader) waits for input in awaitInput, outside coder/websocket, and
// then still serves a run frame.
func TestIdleReaderParks(t *testing.T) {
	e := newEnv(t, envOptions{heartbeat: heartbeat.Config{Interval: time.Hour, IdleTimeout: time.Hour}})
	rc := dialRaw(t, e, nil)
	rc.write(clientFrame(opText, true, []byte("not json")))
	rc.write(clientFrame(opPing, true, []byte("p")))
	rc.pong("p")

	waitParked(t, "after a text frame and a ping")
	rc.write(clientFrame(opText, true, runFrame("after-park", script{Tokens: 2})))
	if got := rc.untilTerminal(); got != tokenTurn(2) {
		t.Errorf("turn after parking = %s, want %s", got, tokenTurn(2))
	}
}

// readerStacks counts the readers parked, in the poller or on a goroutine that waits in
// awaitInput, and the goroutines that wait for a frame inside coder/websocket's reader.
func readerStacks() (parked, inside int) {
	parked = conversation.ParkedReaders()
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		switch {
		case strings.Contains(g, "conversation.(*conn).awaitInput"):
			parked++
		case strings.Contains(g, "coder/websocket.(*Conn).Reader"):
			inside++
		}
	}
	return parked, inside
}

// TestPipelinedReaderParks: a client that sends its first run frame in the handshake's write
// (what net/http reads past the request before the hijack) gets its turn, and its socket's
// reader then parks after a ping like any other.
func TestPipelinedReaderParks(t *testing.T) {
	e := newEnv(t, envOptions{heartbeat: heartbeat.Config{Interval: time.Hour, IdleTimeout: time.Hour}})
	rc := dialRaw(t, e, clientFrame(opText, true, runFrame("piped-parks", script{Tokens: 2})))
	if got := rc.untilTerminal(); got != tokenTurn(2) {
		t.Fatalf("turn = %s, want %s", got, tokenTurn(2))
	}
	rc.write(clientFrame(opPing, true, []byte("p")))
	rc.pong("p")
	waitParked(t, "after a pipelined run frame and a ping")
}

// waitParked waits until the one socket's reader is parked, not inside coder/websocket.
func waitParked(t *testing.T, when string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		parked, inside := readerStacks()
		if parked == 1 && inside == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s, %d readers parked and %d inside coder/websocket; want 1 and 0", when, parked, inside)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestParkedSocketClosedByServer: a socket whose reader is parked, and which the server
// closes while no input arrives (its client answers no heartbeat ping), ends: the client
// reads the end of the connection, and the socket leaves the open count and the parked
// readers.
func TestParkedSocketClosedByServer(t *testing.T) {
	e := newEnv(t, envOptions{heartbeat: heartbeat.Config{Interval: 50 * time.Millisecond, PongTimeout: 100 * time.Millisecond, IdleTimeout: time.Hour}})
	rc := dialRaw(t, e, nil)
	waitParked(t, "fresh")
	rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		if _, _, err := rc.readFrame(); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("the server did not close a socket that answers no ping: %v", err)
			}
			break
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.metric(t, "wsgateway_conversation_open_sockets", "conversation") != 0 || conversation.ParkedReaders() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("socket closed by the server: open sockets %v, parked readers %d; want 0 and 0",
				e.metric(t, "wsgateway_conversation_open_sockets", "conversation"), conversation.ParkedReaders())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
