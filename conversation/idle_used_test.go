package conversation_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/heartbeat"
	"github.com/wsgateway/wsgateway/threadstore"
)

// TestIdleAfterTurn checks that a socket idle again after a turn holds no more of the
// gateway's heap than a socket that never carried one: whatever a turn allocates (its
// queue, buffers, the registry's slot, the writer's batch) is released when it ends. The
// figure is the heap in use of the gateway's own allocations, read from the heap profile at
// every allocation (runtime.MemProfileRate = 1): what the embedded NATS server keeps of a
// run (its log, for resumes, until retention) and what the test's raw clients hold are left
// out. It counts bytes, not time, so a busy machine does not change it.
func TestIdleAfterTurn(t *testing.T) {
	if testing.Short() {
		t.Skip("opens hundreds of sockets")
	}
	profileEveryAllocation(t)
	const n = 200
	e := newEnv(t, envOptions{heartbeat: heartbeat.Config{Interval: time.Hour, IdleTimeout: time.Hour}, maxSockets: 1 << 30})
	addr := strings.TrimPrefix(e.http.URL, "http://")
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	open := func(turn bool) {
		for i := range n {
			c, br := rawSocket(t, addr)
			conns = append(conns, c)
			if !turn {
				continue
			}
			runID := fmt.Sprintf("idle-after-turn-%d", i)
			if _, err := c.Write(maskedText(threadFrame(runID, runID, script{Tokens: 5}, "u1", "hello"))); err != nil {
				t.Fatalf("run frame: %v", err)
			}
			readUntil(t, c, br, []byte("RUN_FINISHED"))
		}
	}
	// One turn first: what the process allocates once (encoding/json's caches of the thread
	// store's types, the NATS connection's grown buffers) is no socket's.
	c, br := rawSocket(t, addr)
	conns = append(conns, c)
	if _, err := c.Write(maskedText(threadFrame("warm-up", "warm-up", script{Tokens: 5}, "u1", "hello"))); err != nil {
		t.Fatalf("run frame: %v", err)
	}
	readUntil(t, c, br, []byte("RUN_FINISHED"))
	base := gatewayHeap()
	g0 := runtime.NumGoroutine()
	open(false)
	fresh := gatewayHeap()
	g1 := runtime.NumGoroutine()
	open(true)
	// The turns' goroutines end after their last event was delivered. The slack is for the
	// NATS server's own, which come and go with its activity (a block's flusher).
	want := g1 + (g1 - g0) + 16
	for deadline := time.Now().Add(10 * time.Second); runtime.NumGoroutine() > want; {
		if time.Now().After(deadline) {
			t.Fatalf("goroutines = %d after the turns, want at most %d (one per socket)", runtime.NumGoroutine(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// What the thread store keeps of the threads it just wrote, for their next turns, is
	// forgotten within threadstore.ThreadsKeptFor: no socket's.
	time.Sleep(threadstore.ThreadsKeptFor)
	used := gatewayHeap()
	perFresh, perUsed := (fresh-base)/n, (used-fresh)/n
	t.Logf("gateway heap per idle socket: fresh %d bytes, after a turn %d bytes", perFresh, perUsed)
	if perUsed > perFresh+1024 {
		t.Errorf("gateway heap per idle socket after a turn = %d bytes, want at most %d (fresh %d + 1024)", perUsed, perFresh+1024, perFresh)
	}
}

// rawSocket opens a conversation socket from a bare TCP connection, which holds no
// goroutine or buffer of its own beyond the returned reader.
func rawSocket(t testing.TB, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("Dial() = %v", err)
	}
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", addr)
	br := bufio.NewReaderSize(c, 512)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		c.Close()
		t.Fatalf("handshake = %v, %v", resp, err)
	}
	return c, br
}

// maskedText returns a client's text frame of payload (shorter than 64 KiB), masked with a
// zero key.
func maskedText(payload []byte) []byte {
	b := []byte{0x81, 0x80 | 126, byte(len(payload) >> 8), byte(len(payload)), 0, 0, 0, 0}
	if len(payload) < 126 {
		b = []byte{0x81, 0x80 | byte(len(payload)), 0, 0, 0, 0}
	}
	return append(b, payload...)
}

// readUntil reads the socket's bytes until they contain want, within 10s.
func readUntil(t testing.TB, c net.Conn, br *bufio.Reader, want []byte) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	var got []byte
	buf := make([]byte, 4096)
	for !bytes.Contains(got, want) {
		k, err := br.Read(buf)
		if err != nil {
			t.Fatalf("reading until %s: %v after %q", want, err, got)
		}
		got = append(got, buf[:k]...)
	}
}

// gatewayHeap returns the heap in use, after two collections, of the allocations whose stack
// is the gateway's: neither the embedded NATS server's nor this package's test code.
func gatewayHeap() int64 {
	recs := memProfile(false)
	var sum int64
	for i := range recs {
		if own(recs[i].Stack()) {
			sum += recs[i].InUseBytes()
		}
	}
	return sum
}

// profileEveryAllocation records every allocation in the heap profile until the test ends.
func profileEveryAllocation(t *testing.T) {
	rate := runtime.MemProfileRate
	runtime.MemProfileRate = 1
	t.Cleanup(func() { runtime.MemProfileRate = rate })
}

// memProfile returns the heap profile as of two collections (runtime.MemProfile's records;
// inuseZero as there).
func memProfile(inuseZero bool) []runtime.MemProfileRecord {
	runtime.GC()
	runtime.GC()
	var recs []runtime.MemProfileRecord
	for {
		n, ok := runtime.MemProfile(recs, inuseZero)
		if ok {
			return recs[:n]
		}
		recs = make([]runtime.MemProfileRecord, n+256)
	}
}

// own reports whether an allocation's stack is the gateway's.
func own(stack []uintptr) bool {
	frames := runtime.CallersFrames(stack)
	for {
		f, more := frames.Next()
		if strings.HasPrefix(f.Function, "github.com/nats-io/nats-server/") || strings.Contains(f.Function, "conversation_test.") {
			return false
		}
		if !more {
			return true
		}
	}
}

// TestHeartbeatGarbage checks what a heartbeat of an idle socket allocates in the gateway's
// own code (its ping frame, its protocol ping, the read of the pong; coder/websocket's
// internals apart), counted as in TestIdleAfterTurn from the heap profile at every
// allocation: ten thousand sockets idle with heartbeats make that much garbage per
// heartbeat interval, which the collector's headroom, and so the process's memory, follows.
// It counts bytes, not time.
func TestHeartbeatGarbage(t *testing.T) {
	if testing.Short() {
		t.Skip("opens hundreds of sockets")
	}
	profileEveryAllocation(t)
	const n = 300
	e := newEnv(t, envOptions{heartbeat: heartbeat.Config{Interval: time.Second, PongTimeout: 10 * time.Second, IdleTimeout: time.Hour}, maxSockets: 1 << 30})
	// Each client answers the protocol pings and counts them.
	var pings atomic.Int64
	for range n {
		rc := dialRaw(t, e, nil)
		go func() {
			for {
				op, p, err := rc.readFrame()
				if err != nil {
					return
				}
				if op == opPing {
					if _, err := rc.c.Write(clientFrame(opPong, true, p)); err != nil {
						return
					}
					pings.Add(1)
				}
			}
		}()
	}
	waitPings := func(k int64) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); pings.Load() < k; {
			if time.Now().After(deadline) {
				t.Fatalf("%d protocol pings answered, want %d", pings.Load(), k)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// Every socket pinged once first: what the first ping allocates once (a socket's map
	// of pings, the pools) is not a heartbeat's. A second apart, a socket's heartbeat
	// frames do not queue up behind one another even on a busy machine.
	waitPings(n)
	all0, own0 := gatewayAllocated()
	p0 := pings.Load()
	waitPings(p0 + 5*n)
	all1, own1 := gatewayAllocated()
	p1 := pings.Load()
	all, own := (all1-all0)/(p1-p0), (own1-own0)/(p1-p0)
	t.Logf("gateway allocations per socket and heartbeat: %d bytes, %d of them outside coder/websocket (%d heartbeats)", all, own, p1-p0)
	// Outside coder/websocket a heartbeat allocates its queue entry and its goroutines'
	// records, 110 to 180 bytes; it was 500 to 540 (2.9 KB in all) while the ping had a
	// context with a timeout of its own and the heartbeat frame took a batch buffer.
	// Inside, about 2 KB: coder/websocket writes and reads each control frame under a
	// context with a 5 s timeout and an AfterFunc, and wraps the error of the parked read
	// (idle.go) twice.
	if own > 350 {
		t.Errorf("gateway allocations per socket and heartbeat outside coder/websocket = %d bytes, want at most 350", own)
	}
}

// gatewayAllocated returns the bytes allocated so far, as of two collections, by allocations
// whose stack is the gateway's (see own), and by those of them with no coder/websocket frame.
func gatewayAllocated() (all, outside int64) {
	recs := memProfile(true)
	for i := range recs {
		if !own(recs[i].Stack()) {
			continue
		}
		all += recs[i].AllocBytes
		if !inWebsocket(recs[i].Stack()) {
			outside += recs[i].AllocBytes
		}
	}
	return all, outside
}

// inWebsocket reports whether an allocation's stack passes through coder/websocket.
func inWebsocket(stack []uintptr) bool {
	frames := runtime.CallersFrames(stack)
	for {
		f, more := frames.Next()
		if strings.HasPrefix(f.Function, "github.com/coder/websocket") {
			return true
		}
		if !more {
			return false
		}
	}
}
