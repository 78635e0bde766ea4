package conversation

import (
	"bufio"
	"net"
	"net/http"
)

// socketBufferSize sizes a socket's read and write buffers. coder/websocket keeps the
// buffers of the hijacked connection for the socket's life; net/http's are 4 KiB each,
// which is most of an idle socket's cost. Frames larger than the buffer bypass it, and every
// frame is flushed on its own, so small buffers cost little throughput.
const socketBufferSize = 512

// smallBuffers is a ResponseWriter whose Hijack returns buffers of socketBufferSize. The
// handshake response is flushed by Hijack, so the write buffer can be replaced; the read
// buffer is replaced unless it already holds bytes of the client (a pipelined first frame).
type smallBuffers struct {
	http.ResponseWriter
}

func (w smallBuffers) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	r := brw.Reader
	if r.Buffered() == 0 {
		r = bufio.NewReaderSize(conn, socketBufferSize)
	} // else the client pipelined its first frame: keep the reader that holds it
	return conn, bufio.NewReadWriter(r, bufio.NewWriterSize(conn, socketBufferSize)), nil
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w smallBuffers) Unwrap() http.ResponseWriter { return w.ResponseWriter }
