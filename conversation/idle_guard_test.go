//go:build unix && !plainreader

package conversation_test

import (
	"runtime"
	"strings"
	"testing"
	"time"

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

// readerStacks counts the goroutines that wait in the conversation reader's awaitInput and
// those that wait for a frame inside coder/websocket's reader.
func readerStacks() (parked, inside int) {
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

// waitParked waits until the one socket's reader waits in awaitInput, not inside
// coder/websocket.
func waitParked(t *testing.T, when string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		parked, inside := readerStacks()
		if parked == 1 && inside == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s, %d readers wait in awaitInput and %d inside coder/websocket; want 1 and 0", when, parked, inside)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
