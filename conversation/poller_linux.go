//go:build linux && !plainreader

package conversation

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
)

// The poller: on Linux an idle conversation socket's reader is no goroutine at all.
//
// A reader waiting in awaitInput costs a goroutine: a 2 KiB stack and the runtime's
// descriptor of it, a third of what an idle socket holds. Instead, when the socket is idle
// (park), its connection is armed in an epoll instance of the process's own, one-shot (it
// reports once, then waits to be armed again), and the reader's goroutine returns. One
// goroutine waits on that instance for every parked socket and starts a reader
// (serveConversation) for each that has input, an end of file or an error. A parked socket
// that another goroutine closes (its batchConn's Close: the writer's close handshake, the
// heartbeat's, Shutdown's) gets a reader too, whose read reports the close, and which ends
// the socket as every reader does.
//
// Each arming carries an id of its own, not the socket's descriptor, which the system gives
// to another connection once this one is closed: the poller starts the reader of the socket
// parked under that id, if it is still parked. Whoever takes a socket out of parked (the
// poller for an event, the batchConn's Close, park itself when arming failed) starts its one
// reader; the others find it gone.
//
// The epoll instance lives as long as the process, and so does its goroutine, started by
// the first socket that parks. Where epoll is refused, readers wait in awaitInput.
type poller struct {
	fd     int      // the epoll instance
	file   *os.File // fd, kept open
	mu     sync.Mutex
	last   uint32           // the last id given
	parked map[uint32]*conn // the sockets whose reader is parked, by the id of their arming
}

const epollOneShot = 1 << 30 // EPOLLONESHOT, which package syscall does not name

var (
	pollerOnce sync.Once
	thePoller  atomic.Pointer[poller] // nil until the first park, and where epoll is refused
)

// idlePoller returns the process's poller, started on first use; nil where epoll is refused.
func idlePoller() *poller {
	pollerOnce.Do(func() {
		fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
		if err != nil {
			return
		}
		// Non-blocking, the instance is a file Go's own poller watches (an epoll instance
		// is readable while it has events to report): the poller's goroutine waits as any
		// socket's would, not in a system call holding a thread, whose return would queue
		// it behind every runnable goroutine of a busy process.
		if err := syscall.SetNonblock(fd, true); err != nil {
			syscall.Close(fd)
			return
		}
		f := os.NewFile(uintptr(fd), "conversation-poller")
		rc, err := f.SyscallConn()
		if err != nil {
			f.Close()
			return
		}
		p := &poller{fd: fd, file: f, parked: make(map[uint32]*conn)}
		go p.run(rc)
		thePoller.Store(p)
	})
	return thePoller.Load()
}

// park arms c's connection and reports true: the poller starts c's reader when it has
// input, or its batchConn's Close does. It reports false, c still the caller's to read,
// when the connection cannot be armed.
func (p *poller) park(c *conn) bool {
	sc, ok := c.out.Conn.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	b := c.out
	p.mu.Lock()
	for p.last++; p.last == 0 || p.parked[p.last] != nil; p.last++ {
	}
	id := p.last
	p.parked[id] = c
	b.parkID = id
	// Set before the arming, under mu: the reader the event starts sees it.
	add := !b.armed
	b.armed = true
	p.mu.Unlock()
	var armErr error
	err = rc.Control(func(fd uintptr) {
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | epollOneShot, Fd: int32(id)}
		op := syscall.EPOLL_CTL_MOD
		if add {
			op = syscall.EPOLL_CTL_ADD
		}
		armErr = syscall.EpollCtl(p.fd, op, int(fd), &ev)
		switch {
		case armErr == syscall.ENOENT:
			armErr = syscall.EpollCtl(p.fd, syscall.EPOLL_CTL_ADD, int(fd), &ev)
		case armErr == syscall.EEXIST:
			armErr = syscall.EpollCtl(p.fd, syscall.EPOLL_CTL_MOD, int(fd), &ev)
		}
	})
	if err == nil && armErr == nil {
		return true
	}
	// The connection is closed, or epoll refused it: read on, unless a Close took the socket
	// already and started its reader, whose read reports the close.
	return p.take(id) == nil
}

// take removes the socket parked under id and returns it, or nil if none is.
func (p *poller) take(id uint32) *conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.parked[id]
	delete(p.parked, id)
	return c
}

// run starts the reader of each socket whose arming reports, for ever: it waits until rc,
// the epoll instance, is readable, then takes its events without waiting. Where Go's poller
// does not watch the instance (rc.Read fails), it waits in epoll_wait.
func (p *poller) run(rc syscall.RawConn) {
	events := make([]syscall.EpollEvent, 128)
	ready := func(uintptr) bool { return p.dispatch(events, 0) > 0 }
	for {
		if err := rc.Read(ready); err != nil {
			p.dispatch(events, -1)
		}
	}
}

// dispatch takes the events epoll reports within timeout (ms, -1: until there is one) and
// starts the reader of each socket still parked under its id; it returns how many it took.
func (p *poller) dispatch(events []syscall.EpollEvent, timeout int) int {
	n, err := syscall.EpollWait(p.fd, events, timeout)
	if err == syscall.EINTR {
		return 0
	}
	if err != nil {
		// Only a fault of this code: every parked socket would wait for ever.
		panic(fmt.Sprintf("conversation: epoll_wait: %v", err))
	}
	for _, ev := range events[:n] {
		if c := p.take(uint32(ev.Fd)); c != nil {
			go c.serveConversation()
		}
	}
	return n
}

// parkedReaders returns how many sockets' readers are parked in the poller.
func parkedReaders() int {
	p := thePoller.Load()
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.parked)
}

// unpark starts the reader of b's socket if it is parked: Close calls it once the
// connection is closed, which the poller would not report (a closed descriptor leaves the
// epoll instance).
func (b *batchConn) unpark() {
	p := thePoller.Load()
	if p == nil {
		return
	}
	p.mu.Lock()
	c := p.parked[b.parkID]
	if c != nil && c.out == b {
		delete(p.parked, b.parkID)
	} else {
		c = nil
	}
	p.mu.Unlock()
	if c != nil {
		go c.serveConversation()
	}
}
