//go:build !linux || plainreader

package conversation

// poller is Linux's (poller_linux.go): elsewhere an idle socket's reader waits in
// awaitInput, on its goroutine.
type poller struct{}

// idlePoller returns nil: there is no poller.
func idlePoller() *poller { return nil }

// park is never called: there is no poller.
func (*poller) park(*conn) bool { return false }

// parkedReaders returns 0: there is no poller.
func parkedReaders() int { return 0 }

// unpark does nothing: no reader is parked outside a goroutine.
func (*batchConn) unpark() {}
