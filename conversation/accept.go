package conversation

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"sync"
	"time"
)

// socketBufferSize sizes a socket's read buffer. coder/websocket keeps the buffers of the
// hijacked connection for the socket's life; net/http's are 4 KiB each, which is most of an
// idle socket's cost. Inbound frames are few and small (run frames, aborts, pongs): the
// buffer holds a frame header and a short frame, and larger payloads are read past it,
// straight into the message.
const socketBufferSize = 128

// batchWriteBufferSize sizes the write buffer of a batching socket: coder/websocket flushes
// it after every frame into the batch buffer, so it only needs to hold a frame header or a
// control frame.
const batchWriteBufferSize = 64

// maxFrameHeader is the longest header of a frame the server sends (unmasked, a 64-bit
// length).
const maxFrameHeader = 10

// batchBufferSize bounds the bytes a batch holds before they are written: a batch of queued
// frames leaves in one write system call per batchBufferSize bytes.
const batchBufferSize = 32 << 10

// batchBuffers holds the buffers of the batches in progress; an idle socket holds none.
var batchBuffers = sync.Pool{New: func() any {
	b := make([]byte, 0, batchBufferSize)
	return &b
}}

// batchHijacker is a ResponseWriter whose Hijack returns the connection as a *batchConn (in
// field conn, for the socket's writer) with small buffers: the read buffer of
// socketBufferSize, the write buffer of batchWriteBufferSize. Each write outside a batch
// must be done within writeTimeout.
type batchHijacker struct {
	http.ResponseWriter
	writeTimeout time.Duration
	conn         *batchConn // set by Hijack
}

func (w *batchHijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return hijack(w.ResponseWriter, batchWriteBufferSize, w.writeTimeout, &w.conn)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *batchHijacker) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// hijack takes over w's connection, wrapped in a batchConn stored in batch, with a read
// buffer of socketBufferSize, a write buffer of writeSize and writeTimeout for each write
// outside a batch. The batchConn knows the read buffer (field in) when its reader may wait
// for input outside coder/websocket (idle.go). What net/http read past the handshake (a
// client that sent its first frame with the handshake, or as soon as the 101 reached it,
// before the hijack) is copied out of net/http's 4 KiB buffer, and the batchConn's reads
// return it first.
func hijack(w http.ResponseWriter, writeSize int, writeTimeout time.Duration, batch **batchConn) (net.Conn, *bufio.ReadWriter, error) {
	raw, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, nil, err
	}
	b := &batchConn{Conn: raw, timeout: writeTimeout}
	*batch = b
	if n := brw.Reader.Buffered(); n > 0 {
		early, _ := brw.Reader.Peek(n)
		b.early = bytes.Clone(early)
	}
	r := bufio.NewReaderSize(b, socketBufferSize)
	if waitable(raw) {
		b.in = r
	}
	return b, bufio.NewReadWriter(r, bufio.NewWriterSize(b, writeSize)), nil
}

// batchConn is a socket's connection whose writes can be batched. Outside a batch every write
// goes to the connection at once, with a deadline of timeout from its start (the writes of
// control frames: pings, whose context has no deadline, pongs and the close handshake; and
// lone short frames). Between begin and end (the writer goroutine writing the
// frames it took from the queue), every write, the batch's frames and any control frame
// (ping, pong, close) another goroutine writes meanwhile, is appended to a pooled buffer,
// written when the buffer would pass batchBufferSize and at end: a control frame waits at
// most until the end of the batch. All writes of a batch share one write deadline.
//
// mu is held across the system calls, so the bytes of concurrent writers, direct or
// buffered, reach the connection in the order they were written.
//
// The batchConn is also the source of the socket's read buffer, and the context of its
// reader's reads, which lets an idle reader wait outside coder/websocket (idle.go).
type batchConn struct {
	net.Conn
	timeout time.Duration // of a write outside a batch; 0: none
	mu      sync.Mutex
	buf     *[]byte // the batch in progress; nil outside a batch

	parking // the idle reader's state (idle.go)
}

// Write writes p, or appends it to the batch in progress.
func (c *batchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.buf == nil {
		if c.timeout > 0 {
			// An error here means the connection is closed: the write reports it.
			_ = c.Conn.SetWriteDeadline(time.Now().Add(c.timeout))
		}
		return c.Conn.Write(p)
	}
	if len(*c.buf)+len(p) > batchBufferSize {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
		if len(p) >= batchBufferSize {
			return c.Conn.Write(p)
		}
	}
	*c.buf = append(*c.buf, p...)
	return len(p), nil
}

// begin starts a batch whose writes must be done by deadline.
func (c *batchConn) begin(deadline time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// An error here means the connection is closed: the batch's writes report it.
	_ = c.Conn.SetWriteDeadline(deadline)
	if c.buf == nil {
		c.buf = batchBuffers.Get().(*[]byte)
	}
}

// end writes what the batch holds, returns its buffer to the pool and clears the write
// deadline (a write outside a batch sets its own, with timeout).
func (c *batchConn) end() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.buf == nil {
		return nil
	}
	err := c.flushLocked()
	batchBuffers.Put(c.buf)
	c.buf = nil
	_ = c.Conn.SetWriteDeadline(time.Time{})
	return err
}

// flushLocked writes the batch's bytes and empties the buffer, also on error (the socket is
// closed then).
func (c *batchConn) flushLocked() error {
	b := *c.buf
	*c.buf = b[:0]
	if len(b) == 0 {
		return nil
	}
	_, err := c.Conn.Write(b)
	return err
}
