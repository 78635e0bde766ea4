package conversation_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/protocol"
)

// These tests read the socket the ways an idle reader's parking must not break (idle.go):
// bytes that arrive with the handshake, control frames between and inside messages, large
// frames, and TLS.

// rawClient is a WebSocket client on a bare TCP connection, so that tests choose how frames
// are split across writes.
type rawClient struct {
	t    testing.TB
	c    net.Conn
	br   *bufio.Reader
	sent int // bytes of a message written with the handshake
}

// dialRaw opens a conversation socket; extra is written with the handshake request, in the
// same write.
func dialRaw(t testing.TB, e *env, extra []byte) *rawClient {
	t.Helper()
	return dialRawQuery(t, e, "", extra, 0)
}

// dialRawQuery opens a socket at /ws with the query (a resume socket's runId and offset, or
// ""); extra is written with the handshake request, in the same write. rcvbuf, if not 0, is
// the connection's receive buffer (SO_RCVBUF), which caps what the server sends ahead of the
// client's reads.
func dialRawQuery(t testing.TB, e *env, query string, extra []byte, rcvbuf int) *rawClient {
	t.Helper()
	path := "/ws"
	if query != "" {
		path += "?" + query
	}
	addr := strings.TrimPrefix(e.http.URL, "http://")
	var d net.Dialer
	if rcvbuf != 0 {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var err error
			rc.Control(func(fd uintptr) { err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf) })
			return err
		}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("Dial() = %v", err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(30 * time.Second))
	req := fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", path, addr)
	if _, err := c.Write(append([]byte(req), extra...)); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("handshake = %v, %v", resp, err)
	}
	return &rawClient{t: t, c: c, br: br}
}

// Opcodes of the frames these tests write.
const (
	opContinuation = 0x0
	opText         = 0x1
	opPing         = 0x9
	opPong         = 0xa
)

// clientFrame returns a client frame (masked with a zero key, which leaves the payload as
// it is).
func clientFrame(opcode byte, fin bool, payload []byte) []byte {
	b := opcode
	if fin {
		b |= 0x80
	}
	out := []byte{b}
	switch n := len(payload); {
	case n < 126:
		out = append(out, 0x80|byte(n))
	case n <= 0xffff:
		out = append(out, 0x80|126)
		out = binary.BigEndian.AppendUint16(out, uint16(n))
	default:
		out = append(out, 0x80|127)
		out = binary.BigEndian.AppendUint64(out, uint64(n))
	}
	return append(append(out, 0, 0, 0, 0), payload...)
}

func (rc *rawClient) write(frames ...[]byte) {
	rc.t.Helper()
	var b []byte
	for _, f := range frames {
		b = append(b, f...)
	}
	if _, err := rc.c.Write(b); err != nil {
		rc.t.Fatalf("Write() = %v", err)
	}
}

// read returns the next frame from the server (unmasked, unfragmented).
func (rc *rawClient) read() (opcode byte, payload []byte) {
	rc.t.Helper()
	opcode, payload, err := rc.readFrame()
	if err != nil {
		rc.t.Fatalf("reading a frame: %v", err)
	}
	return opcode, payload
}

// readFrame returns the next frame from the server, or the error that ended the
// connection.
func (rc *rawClient) readFrame() (opcode byte, payload []byte, err error) {
	var h [2]byte
	if _, err := io.ReadFull(rc.br, h[:]); err != nil {
		return 0, nil, err
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var l [2]byte
		if _, err := io.ReadFull(rc.br, l[:]); err != nil {
			return 0, nil, err
		}
		n = uint64(binary.BigEndian.Uint16(l[:]))
	case 127:
		var l [8]byte
		if _, err := io.ReadFull(rc.br, l[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(l[:])
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(rc.br, payload); err != nil {
		return 0, nil, err
	}
	return h[0] & 0xf, payload, nil
}

// pong reads the server's pong to a ping with payload.
func (rc *rawClient) pong(payload string) {
	rc.t.Helper()
	if op, p := rc.read(); op != opPong || string(p) != payload {
		rc.t.Fatalf("frame %x %q, want the pong %q", op, p, payload)
	}
}

// untilTerminal reads text frames until a terminal event, and returns their summary.
func (rc *rawClient) untilTerminal() string {
	rc.t.Helper()
	var frames []frame
	for {
		op, p := rc.read()
		if op != opText {
			rc.t.Fatalf("frame with opcode %x after %d events, want text", op, len(frames))
		}
		sf, err := protocol.DecodeServerFrame(p)
		if err != nil {
			rc.t.Fatalf("DecodeServerFrame(%s) = %v", p, err)
		}
		if sf.Kind == protocol.FramePing {
			continue
		}
		frames = append(frames, frame{ServerFrame: sf, raw: string(p)})
		if sf.Type.Terminal() {
			return summary(frames)
		}
	}
}

// TestPipelinedRunFrame: a client that sends its first run frame with the handshake, in one
// write, gets its turn.
func TestPipelinedRunFrame(t *testing.T) {
	e := newEnv(t, envOptions{})
	rc := dialRaw(t, e, clientFrame(opText, true, runFrame("piped", script{Tokens: 2})))
	if got := rc.untilTerminal(); got != tokenTurn(2) {
		t.Errorf("turn = %s, want %s", got, tokenTurn(2))
	}
	// The socket goes on serving frames, and pings.
	rc.write(clientFrame(opPing, true, []byte("p1")))
	rc.pong("p1")
	rc.write(clientFrame(opText, true, runFrame("after", script{Tokens: 1})))
	if got := rc.untilTerminal(); got != tokenTurn(1) {
		t.Errorf("second turn = %s, want %s", got, tokenTurn(1))
	}
}

// TestControlFrames: pings of the client are answered whether they come alone, followed by
// a run frame in the same write, or between the fragments of a run frame, and the socket
// serves the run frames.
func TestControlFrames(t *testing.T) {
	e := newEnv(t, envOptions{memory: true})
	rc := dialRaw(t, e, nil)

	// Alone, twice (the server waits for input between them).
	for _, p := range []string{"a", "b"} {
		rc.write(clientFrame(opPing, true, []byte(p)))
		rc.pong(p)
	}
	// A ping and a run frame in one write.
	rc.write(clientFrame(opPing, true, []byte("c")), clientFrame(opText, true, runFrame("with-ping", script{Tokens: 1})))
	rc.pong("c")
	if got := rc.untilTerminal(); got != tokenTurn(1) {
		t.Errorf("turn after a ping = %s, want %s", got, tokenTurn(1))
	}
	// A ping between two fragments of a run frame: the pong comes before the last fragment
	// is sent, so the server read the ping with nothing after it.
	data := runFrame("fragmented", script{Tokens: 3})
	half := len(data) / 2
	rc.write(clientFrame(opText, false, data[:half]))
	rc.write(clientFrame(opPing, true, []byte("d")))
	rc.pong("d")
	rc.write(clientFrame(opContinuation, true, data[half:]))
	if got := rc.untilTerminal(); got != tokenTurn(3) {
		t.Errorf("turn of a fragmented run frame = %s, want %s", got, tokenTurn(3))
	}
}

// TestLargeRunFrames: run frames of a few KB and of almost the read limit (1 MiB) are read
// whole; a larger one closes the socket 1009.
func TestLargeRunFrames(t *testing.T) {
	e := newEnv(t, envOptions{memory: true})
	cl := dial(t, e.url(), "")
	for _, size := range []int{4 << 10, 1<<20 - 1024} {
		runID := fmt.Sprintf("large-%d", size)
		data := bigRunFrame(runID, size)
		if len(data) > 1<<20 {
			t.Fatalf("run frame of %d bytes, over the read limit", len(data))
		}
		cl.send(data)
		if got := summary(cl.untilTerminal()); got != tokenTurn(1) {
			t.Errorf("turn of a %d-byte run frame = %s, want %s", len(data), got, tokenTurn(1))
		}
	}
	cl.send(bigRunFrame("too-large", 1<<20+1024))
	if _, end := cl.untilClose(); end.code != websocket.StatusMessageTooBig {
		t.Errorf("socket after a run frame over the read limit closed %v, want 1009", end.err)
	}
}

// bigRunFrame returns a run frame for runID of about size bytes (one token reply).
func bigRunFrame(runID string, size int) []byte {
	base := runFrame(runID, script{Tokens: 1})
	var in map[string]any
	json.Unmarshal(base, &in)
	in["messages"] = []any{map[string]any{"id": "u1", "role": "user", "content": strings.Repeat("x", max(size-len(base), 1))}}
	data, _ := json.Marshal(in)
	return data
}

// TestTLSSocket: a socket over TLS (whose reader waits inside coder/websocket) serves turns
// and answers pings.
func TestTLSSocket(t *testing.T) {
	e := newEnv(t, envOptions{})
	ts := httptest.NewUnstartedServer(e.srv)
	ts.StartTLS()
	t.Cleanup(ts.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "wss"+strings.TrimPrefix(ts.URL, "https"), &websocket.DialOptions{HTTPClient: ts.Client()})
	if err != nil {
		t.Fatalf("Dial() = %v", err)
	}
	cl := &client{t: t, c: c, ctx: ctx, done: cancel}
	t.Cleanup(func() { c.CloseNow() })
	cl.send(runFrame("tls", script{Tokens: 2}))
	if got := summary(cl.untilTerminal()); got != tokenTurn(2) {
		t.Errorf("turn = %s, want %s", got, tokenTurn(2))
	}
	// The client's pong reader: CloseRead reads control frames.
	readCtx := c.CloseRead(ctx)
	if err := c.Ping(ctx); err != nil {
		t.Errorf("Ping() = %v", err)
	}
	c.Close(websocket.StatusNormalClosure, "")
	<-readCtx.Done()
}

// TestCloseWhilePinging closes sockets (Shutdown, with a close handshake) while their
// clients send pings without pause, so that the reader waits and reads in turn with the
// close handshake: every socket ends, and Shutdown returns. (A client that is still sending
// when the server closes may get a reset instead of the close frame: TCP discards what the
// server had not sent yet.)
func TestCloseWhilePinging(t *testing.T) {
	e := newEnv(t, envOptions{memory: true})
	const sockets = 20
	clients := make([]*rawClient, sockets)
	for i := range clients {
		clients[i] = dialRaw(t, e, nil)
		clients[i].write(clientFrame(opPing, true, []byte("first")))
		clients[i].pong("first")
	}
	ends := make(chan error, sockets) // nil: the close frame 1012
	for _, rc := range clients {
		go func() { // ping until the connection ends
			ping := clientFrame(opPing, true, []byte("p"))
			for {
				if _, err := rc.c.Write(ping); err != nil {
					return
				}
			}
		}()
		go func() { // read pongs until the close frame
			for {
				op, p, err := rc.readFrame()
				switch {
				case err != nil:
					ends <- err
					return
				case op == 0x8:
					if websocket.StatusCode(binary.BigEndian.Uint16(p)) != websocket.StatusServiceRestart {
						err = fmt.Errorf("close frame %q", p)
					}
					ends <- err
					rc.c.Close()
					return
				}
			}
		}()
	}
	time.Sleep(50 * time.Millisecond) // pings flow
	if err := e.srv.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown() = %v", err)
	}
	for i := range sockets {
		if err := <-ends; err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("socket %d ended with %v, want the close 1012 or the connection's end", i, err)
		}
	}
}
