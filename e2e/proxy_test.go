package e2e

import (
	"io"
	"net"
	"sync"
	"testing"
)

// proxy forwards loopback TCP connections to a target address. Cut closes the connections that
// are open at that moment (the client sees its socket drop, as on a network failure) while new
// connections keep being accepted; Retarget sends new connections elsewhere (a load balancer
// picking another gateway).
type proxy struct {
	Addr string // host:port clients dial
	ln   net.Listener

	mu       sync.Mutex
	target   string
	conns    map[net.Conn]struct{}
	accepted int
	wg       sync.WaitGroup
}

// newProxy starts a proxy to target on a free loopback port, closed when the test ends.
func newProxy(tb testing.TB, target string) *proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	tb.Cleanup(p.close)
	return p
}

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		target := p.target
		p.mu.Unlock()
		up, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.accepted++
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

// pipe copies src to dst until either side fails or is cut, then closes both.
func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	io.Copy(dst, src)
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// Cut closes every connection open through the proxy and returns how many client connections
// it cut.
func (p *proxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.conns) / 2
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) // a reset, as when a network path dies, not a polite FIN
		}
		c.Close()
	}
	return n
}

// Retarget sends the connections accepted from now on to target.
func (p *proxy) Retarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

// Accepted returns how many client connections the proxy has accepted so far.
func (p *proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

func (p *proxy) close() {
	p.ln.Close()
	p.Cut()
	p.wg.Wait()
}
