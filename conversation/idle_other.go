//go:build !unix || plainreader

package conversation

import (
	"net"

	"github.com/coder/websocket"
)

// parkOptions sets nothing: outside Unix a socket's reader waits inside coder/websocket.
func parkOptions(*websocket.AcceptOptions) {}

// waitable reports false: outside Unix a socket's reader waits inside coder/websocket.
func waitable(net.Conn) bool { return false }

// waitReadable is never called outside Unix (waitable).
func waitReadable(net.Conn) {}
