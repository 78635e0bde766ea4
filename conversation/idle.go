package conversation

import (
	"bufio"
	"errors"
	"io"
	"time"

	"github.com/coder/websocket"
)

// An idle socket's reader is no goroutine on Linux, and elsewhere on Unix a goroutine with
// a stack of 2 KiB, the size a goroutine starts with.
//
// Inside coder/websocket's read path, the wait for the next frame is about 2 KiB deep, which
// makes the stack 4 KiB. Instead, when the socket's read buffer is empty at a message
// boundary, the reader waits outside coder/websocket until the connection has input (an end
// of file, an error or a close count too): on Linux it parks in the poller (park,
// poller_linux.go) and its goroutine returns; elsewhere it waits in awaitInput, with about
// 700 bytes of stack in use. Reading a frame still grows the stack to 4 KiB, and the garbage
// collector would not shrink it back: it halves a stack only when the bytes in use plus an
// 800-byte guard are less than a quarter of it. So a conversation socket's reader reads each
// frame on a goroutine of its own, which hands the reading on (readNext: to the poller, or
// to a new goroutine) and returns with its grown stack. A resume socket's reader (whose
// inbound frames are ignored) stays on its goroutine.
//
// There are two message boundaries where the reader waits:
//   - before it asks coder/websocket for a message (conn.next, and park before it);
//   - after a control frame read while it waits for a message's first frame (the pong of a
//     heartbeat ping, or a client's ping): coder/websocket handles it and would wait for
//     the next frame where it stands. If the read buffer is empty, parkAfterControl arms the
//     batchConn so that its next read, of the first byte of the next frame header, returns
//     errParked instead of waiting. coder/websocket (v1.8.15) returns that error from Reader
//     without closing the socket, and no byte of a frame was consumed; the reader parks, or
//     waits in awaitInput, before it asks again. TestControlFrames fails if a version of
//     coder/websocket closes the socket there.
//
// The reader waits outside coder/websocket only where waitable allows it (a plain TCP or
// Unix socket on Unix, whose input is all in the kernel, in the read buffer, or in what
// net/http read before the hijack). Elsewhere it waits inside coder/websocket, on one
// goroutine.

// The technique relies on behaviour of coder/websocket that its API does not promise (the
// errParked read above, and the context of reads reaching the control frame callbacks):
// go.mod pins the version, and TestControlFrames and TestIdleReaderParks must pass before
// an upgrade. Building with the tag plainreader leaves it out (the reader always waits
// inside coder/websocket), which is how BENCHMARKS.md measures what it saves.

// parking is the state of a socket's reader that waits outside coder/websocket; a
// batchConn holds it.
type parking struct {
	in     *bufio.Reader // the socket's read buffer; nil: the reader never parks
	early  []byte        // read by net/http before the hijack: reads return it first
	header bool          // the reader waits for a message's first frame
	park   bool          // the next read from the connection returns errParked
	parkID uint32        // the id of the socket's last arming in the poller (under its mu)
	armed  bool          // the connection is in the poller's epoll instance (under its mu)
}

// drained reports whether the socket's input is all in the kernel: nothing in its read
// buffer, nor read before the hijack and not yet in the buffer.
func (p *parking) drained() bool {
	return p.in.Buffered() == 0 && len(p.early) == 0
}

// errParked is the error of a read that would wait for the first byte of a frame header
// after a control frame; conn.next waits in awaitInput instead.
var errParked = errors.New("conversation: reader parked")

// socketKey is the context key under which a batchConn, the context of its socket's reads,
// finds itself.
type socketKey struct{}

// Deadline, Done, Err and Value make a batchConn the context of its socket's reads
// (conn.next): coder/websocket hands it to the control frame callbacks (parkAfterControl).
// It is never done, so coder/websocket arms no timer for a read.
func (c *batchConn) Deadline() (time.Time, bool) { return time.Time{}, false }

// Done returns nil: the context of reads is never done.
func (c *batchConn) Done() <-chan struct{} { return nil }

// Err returns nil: the context of reads is never done.
func (c *batchConn) Err() error { return nil }

// Value returns the batchConn for socketKey.
func (c *batchConn) Value(key any) any {
	if key == (socketKey{}) {
		return c
	}
	return nil
}

// Read reads from the connection, after what net/http read before the hijack, or returns
// errParked once when parkAfterControl armed it. park is set and cleared under
// coder/websocket's read lock: parkAfterControl runs in its read path, and it reads the
// connection only under that lock.
func (c *batchConn) Read(p []byte) (int, error) {
	if c.park {
		c.park = false
		return 0, errParked
	}
	if len(c.early) > 0 {
		n := copy(p, c.early)
		if c.early = c.early[n:]; len(c.early) == 0 {
			c.early = nil
		}
		return n, nil
	}
	return c.Conn.Read(p)
}

// Close closes the connection, and starts the socket's reader if it is parked in the
// poller: its read reports the close.
func (c *batchConn) Close() error {
	err := c.Conn.Close()
	c.unpark()
	return err
}

// readNext hands the reading of the socket on, after a frame or a control frame: to the
// poller when the socket is idle (park), else to a new goroutine, whose stack has not grown
// (serveConversation).
func (c *conn) readNext() {
	if !c.park() {
		go c.serveConversation()
	}
}

// park parks the socket's reader in the poller (poller_linux.go) if the socket is idle: its
// read buffer empty, no close handshake under way (gone, which reads the buffer). It reports
// whether it did; if it did, the caller returns, and the poller starts the next reader.
func (c *conn) park() bool {
	b := c.out
	if b.in == nil {
		return false
	}
	p := idlePoller()
	if p == nil {
		return false
	}
	c.mu.Lock()
	idle := !c.gone && b.drained()
	c.mu.Unlock()
	return idle && p.park(c)
}

// next returns the socket's next message, waiting for it in awaitInput when the socket is
// idle; errParked when a control frame was read meanwhile.
func (c *conn) next() (websocket.MessageType, io.Reader, error) {
	c.awaitInput()
	b := c.out
	b.header = b.in != nil
	typ, r, err := c.ws.Reader(b)
	b.header = false
	return typ, r, err
}

// awaitInput waits until the connection has input when the read buffer is empty; it returns
// at once for a socket whose reader does not park, and for one the poller woke (it has
// input). The writer's close handshake reads the buffer too, after it set gone under mu
// (writeLoop), so the buffer is looked at under mu, and only before that.
func (c *conn) awaitInput() {
	b := c.out
	if b.in == nil {
		return
	}
	c.mu.Lock()
	idle := !c.gone && b.drained()
	c.mu.Unlock()
	if idle {
		waitReadable(b.Conn)
	}
}
