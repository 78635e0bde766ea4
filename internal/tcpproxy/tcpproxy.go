// Package tcpproxy is a loopback TCP proxy for tests. Put between clients and a server, or
// between the nodes of a NATS cluster (in front of the route ports they advertise), it lets a
// test fail the network the way the real one does: Cut resets every open connection, Close
// also refuses new ones (the host is gone), SetTarget sends new connections to another server
// (a load balancer's choice), a refuse function drops connections by the first line their
// client sends (the CONNECT of a crashed NATS node's routes), and Stall stops forwarding
// while every connection stays open (a stalled server or path) until Resume.
package tcpproxy

import (
	"bufio"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/wsgateway/wsgateway/internal/testenv"
)

// Proxy forwards the connections it accepts on a loopback port to its target.
type Proxy struct {
	ln     net.Listener
	refuse func(first []byte) bool // nil: forward every connection as it is
	ready  chan struct{}           // closed once there is a target
	done   chan struct{}           // closed by Close
	once   sync.Once               // closes done

	mu       sync.Mutex
	stalled  chan struct{} // non-nil while stalled, closed by Resume
	target   string
	conns    map[*conn]struct{}
	accepted int
	closed   bool
	wg       sync.WaitGroup
}

type conn struct {
	client, server net.Conn
	first          []byte // the first line the client sent, once read (with refuse)
}

// reset closes both sides, the client's with a reset, as when a network path dies, not with a
// polite FIN.
func (c *conn) reset() {
	if tc, ok := c.client.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.client.Close()
	c.server.Close()
}

// Start listens on a free loopback port that browsers accept and forwards the connections it
// accepts to target; with target "", they wait for SetTarget. refuse, when not nil, reads the
// first line each client sends and closes the connection when it returns true. The proxy is
// closed when the test ends.
func Start(tb testing.TB, target string, refuse func(first []byte) bool) *Proxy {
	tb.Helper()
	ln := testenv.Listen(tb)
	p := &Proxy{ln: ln, refuse: refuse, ready: make(chan struct{}), done: make(chan struct{}),
		conns: map[*conn]struct{}{}}
	if target != "" {
		p.SetTarget(target)
	}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.Close)
	return p
}

// Addr returns the host:port clients dial.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetTarget sends the connections accepted from now on to target.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.target == "" {
		close(p.ready)
	}
	p.target = target
}

// Accepted returns how many connections the proxy has forwarded so far.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Stall stops forwarding bytes in both directions on every connection, open or new, until
// Resume: the connections stay open, what their ends send waits in the proxy and the
// kernel's buffers, as on a stalled network path or server.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
}

// Resume forwards again what Stall held, and what follows.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
}

// gate returns once the proxy is not stalled, or closed.
func (p *Proxy) gate() {
	p.mu.Lock()
	stalled := p.stalled
	p.mu.Unlock()
	if stalled != nil {
		select {
		case <-stalled:
		case <-p.done:
		}
	}
}

// copy copies src to dst as io.Copy does, holding each chunk while the proxy is stalled.
func (p *Proxy) copy(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.gate()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Cut resets every connection open through the proxy and returns how many it reset. New
// connections are still accepted.
func (p *Proxy) Cut() int {
	return p.cut(func(*conn) bool { return true })
}

// CutRefused resets the open connections whose first line refuse refuses now.
func (p *Proxy) CutRefused() {
	p.cut(func(c *conn) bool { return c.first != nil && p.refuse(c.first) })
}

// cut resets the open connections that match, and returns how many.
func (p *Proxy) cut(match func(*conn) bool) int {
	p.mu.Lock()
	var cut []*conn
	for c := range p.conns {
		if match(c) {
			cut = append(cut, c)
		}
	}
	p.mu.Unlock()
	for _, c := range cut {
		c.reset()
	}
	return len(cut)
}

// Close resets every connection and refuses new ones, and returns once the proxy's goroutines
// have. It may be called more than once.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.once.Do(func() { close(p.done) })
	p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		select {
		case <-p.ready:
		case <-p.done:
			client.Close()
			return
		}
		p.mu.Lock()
		target := p.target
		p.mu.Unlock()
		server, err := net.Dial("tcp", target)
		if err != nil {
			client.Close()
			continue
		}
		c := &conn{client: client, server: server}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.reset()
			return
		}
		p.accepted++
		p.conns[c] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.forward(c)
		go func() {
			defer p.wg.Done()
			p.copy(c.client, c.server)
			p.remove(c)
		}()
	}
}

// forward copies what c's client sends to its server, after checking its first line when
// there is a refuse function.
func (p *Proxy) forward(c *conn) {
	defer p.wg.Done()
	defer p.remove(c)
	if p.refuse == nil {
		p.copy(c.server, c.client)
		return
	}
	br := bufio.NewReader(c.client)
	first, err := br.ReadSlice('\n')
	if err != nil {
		return
	}
	first = append([]byte(nil), first...)
	p.mu.Lock()
	c.first = first
	p.mu.Unlock()
	if p.refuse(first) {
		return
	}
	p.gate()
	if _, err := c.server.Write(first); err != nil {
		return
	}
	p.copy(c.server, br)
}

// remove closes both sides of c and forgets it.
func (p *Proxy) remove(c *conn) {
	c.client.Close()
	c.server.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}
