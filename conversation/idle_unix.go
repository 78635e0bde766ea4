//go:build unix && !plainreader

package conversation

import (
	"context"
	"net"
	"syscall"

	"github.com/coder/websocket"
)

// parkOptions sets the control frame callbacks of the Server's AcceptOptions.
func parkOptions(o *websocket.AcceptOptions) {
	o.OnPingReceived = parkAfterPing
	o.OnPongReceived = parkAfterControl
}

// parkAfterControl runs in coder/websocket's read path after each control frame read
// (AcceptOptions.OnPongReceived, and OnPingReceived before the pong is sent). When the
// socket's reader waits for a message's first frame and nothing is buffered, it arms the
// batchConn: the read of the next frame header returns errParked. Reads of the close
// handshake have another context and are left alone.
func parkAfterControl(ctx context.Context, _ []byte) {
	c, _ := ctx.Value(socketKey{}).(*batchConn)
	if c != nil && c.header && c.drained() {
		c.park = true
	}
}

// parkAfterPing is parkAfterControl for pings; the pong is sent. (If the pong cannot be
// sent, the read fails and the socket ends: a close handshake under way then ends at the
// armed read instead of waiting for the peer's close frame.)
func parkAfterPing(ctx context.Context, payload []byte) bool {
	parkAfterControl(ctx, payload)
	return true
}

// waitable reports whether conn, a hijacked connection, keeps no input of its own besides
// the kernel's, so that waitReadable may stand for a read: a plain TCP or Unix socket (not
// a TLS connection, whose decrypted bytes are buffered, nor a listener's wrapper).
func waitable(conn net.Conn) bool {
	switch conn.(type) {
	case *net.TCPConn, *net.UnixConn:
		return true
	}
	return false
}

// waitReadable waits until conn (waitable) has input, an end of file or an error to read,
// or is closed. It reads nothing.
func waitReadable(conn net.Conn) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	// An error means the connection is closed: the read that follows reports it.
	_ = rc.Read(readable)
}

// readable reports whether a read of the socket fd would not wait: it peeks at one byte
// (the socket is non-blocking, as every socket of package net). false makes RawConn.Read
// wait for the poller.
func readable(fd uintptr) bool {
	var b [1]byte
	for {
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK)
		if err == syscall.EINTR {
			continue
		}
		// Otherwise a byte, an end of file or an error: the read reports it.
		return err != syscall.EAGAIN && err != syscall.EWOULDBLOCK
	}
}
