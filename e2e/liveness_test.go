package e2e

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/internal/tcpproxy"
)

var killTurns = flag.Int("kill-turns", 50, "live turns on each gateway in TestGatewayKilledWithManyTurns (the full size: 1000)")

// TestGatewayKilledWithManyTurns: two gateways on one NATS each hold many live turns (a few
// events a second); kill -9 of one. The survivor takes every turn of the dead gateway over
// (--takeover auto: on for the demo agent): each client, resuming through the survivor by
// the offset it had, gets the rest of its turn, every delta once and in order, then
// RUN_FINISHED; a reader that joined at the log's tail after the kill gets its first event,
// the first the new producer appended, within the lease TTL plus 5 s of the kill; a join from
// the start reads each log whole, with one terminal, and `wsgateway verify` and @ag-ui/client
// accept it; the survivor's own turns all complete untouched.
func TestGatewayKilledWithManyTurns(t *testing.T) {
	const ttl = 5 * time.Second
	n := *killTurns
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute+time.Duration(n)*200*time.Millisecond)
	defer cancel()
	survivor := startGateway(t, "--lease-ttl", ttl.String()) // holds NATS
	doomed := startGateway(t, "--nats-url", survivor.NATSURL, "--lease-ttl", ttl.String())
	const tokens = 100
	demo := fmt.Sprintf(`{"tokens":%d,"intervalMs":300}`, tokens) // 30 s, about 3 events/s

	// Every turn is started and has delivered its first delta before the kill.
	start := func(gw *gateway, prefix string) ([]*websocket.Conn, [][]envelope) {
		conns, firsts := make([]*websocket.Conn, n), make([][]envelope, n)
		var wg sync.WaitGroup
		sem := make(chan struct{}, 32)
		for i := range conns {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				c := startTurn(t, ctx, gw, fmt.Sprintf("%s-%d", prefix, i), demo)
				first, _, err := readFrames(ctx, c, contentCount(1))
				if err != nil {
					t.Errorf("turn %s-%d: %v", prefix, i, err)
				}
				conns[i], firsts[i] = c, first
			}()
		}
		wg.Wait()
		return conns, firsts
	}
	kept, keptGot := start(survivor, "kept")
	lost, lostGot := start(doomed, "lost")
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d live turns on each gateway", n)

	// The survivor's turns are read to their end meanwhile.
	var wg sync.WaitGroup
	for i, c := range kept {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, _, err := readFrames(ctx, c, turnEnded)
			if err != nil {
				t.Errorf("turn kept-%d: %v", i, err)
			}
			keptGot[i] = append(keptGot[i], got...)
		}()
	}

	doomed.signal(t, syscall.SIGKILL)
	killed := time.Now()
	doomed.wait(t, 10*time.Second)
	for _, c := range lost {
		c.CloseNow()
	}
	// What the dead gateway stored is all there is until a takeover appends: a reader from
	// the log's tail ("now") gets the new producer's first event.
	continued := make([]time.Duration, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runID := fmt.Sprintf("lost-%d", i)
			c, err := dialWS(ctx, resumeURL(survivor, runID, "now"))
			if err != nil {
				t.Errorf("join %s at its tail: %v", runID, err)
				return
			}
			defer c.CloseNow()
			if _, _, err := readFrames(ctx, c, func(es []envelope) bool { return len(es) > 0 }); err != nil {
				t.Errorf("join %s at its tail: %v", runID, err)
			}
			continued[i] = time.Since(killed)
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			f := &follower{runID: fmt.Sprintf("lost-%d", i), got: lostGot[i]}
			f.resume(t, ctx, survivor)
			if code := checkSequence(t, f.runID+" resumed on the survivor", f.got, tokens); code != "" {
				t.Errorf("%s ended with code %q, want a complete turn", f.runID, code)
			}
		}()
	}
	wg.Wait()
	slices.Sort(continued)
	last := continued[n-1]
	t.Logf("the %d turns of the killed gateway were taken over: the first event of each new producer within %v of the kill (lease TTL %v; p50 %v, p99 %v)",
		n, last.Round(10*time.Millisecond), ttl, continued[n/2].Round(10*time.Millisecond), continued[n*99/100].Round(10*time.Millisecond))
	if last > ttl+5*time.Second {
		t.Errorf("the last turn of the killed gateway went on %v after the kill, want within the lease TTL %v plus 5s", last, ttl)
	}
	for i := range n {
		events := chunksOf(t, ctx, survivor, fmt.Sprintf("lost-%d", i))
		if len(events) != len(demoTurn(tokens))-1 { // demoTurn counts the marker
			t.Errorf("the log of lost-%d holds %d events, want the %d of a whole turn", i, len(events), len(demoTurn(tokens))-1)
		}
		verifyLog(t, events)
	}
	for i, got := range keptGot {
		if code := checkSequence(t, fmt.Sprintf("kept-%d on the survivor", i), got, tokens); code != "" {
			t.Errorf("kept-%d of the surviving gateway ended %q, want complete", i, code)
		}
	}
}

// TestGatewayCutFromNATS: a gateway cut from NATS for 10 s (its NATS connections reset and
// refused; its clients still reach it) while 50 turns stream on it. The other gateway takes
// the turns over; once the cut heals, the cut gateway learns that it lost them and closes
// their sockets 1012 "run moved"; each client resumes on the other gateway by its last offset
// and gets the rest of its turn, each delta once, then RUN_FINISHED. Nothing the cut gateway
// tried to write meanwhile is in any log: each log holds the whole turn once, and
// `wsgateway verify` and @ag-ui/client accept it.
func TestGatewayCutFromNATS(t *testing.T) {
	const (
		n      = 50
		tokens = 60
		ttl    = 3 * time.Second
		cutFor = 10 * time.Second
	)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	survivor := startGateway(t, "--lease-ttl", ttl.String()) // holds NATS
	var down atomic.Bool
	px := tcpproxy.Start(t, strings.TrimPrefix(survivor.NATSURL, "nats://"), func([]byte) bool { return down.Load() })
	cut := startGateway(t, "--nats-url", "nats://"+px.Addr(), "--lease-ttl", ttl.String())
	demo := fmt.Sprintf(`{"tokens":%d,"intervalMs":500}`, tokens) // 30 s: every turn outlasts the cut
	conns, firsts := make([]*websocket.Conn, n), make([][]envelope, n)
	var started sync.WaitGroup
	for i := range n {
		started.Add(1)
		go func() {
			defer started.Done()
			conns[i] = startTurn(t, ctx, cut, fmt.Sprintf("cut-%d", i), demo)
			first, _, err := readFrames(ctx, conns[i], contentCount(1))
			if err != nil {
				t.Errorf("turn cut-%d: %v", i, err)
			}
			firsts[i] = first
		}()
	}
	started.Wait()
	if t.Failed() {
		t.FailNow()
	}
	down.Store(true)
	px.Cut()
	time.Sleep(cutFor)
	down.Store(false)
	var wg sync.WaitGroup
	var moved atomic.Int32
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f := &follower{runID: fmt.Sprintf("cut-%d", i), got: firsts[i]}
			f.read(ctx, conns[i], turnEnded)
			if f.status == websocket.StatusServiceRestart {
				moved.Add(1)
			}
			f.resume(t, ctx, survivor)
			if code := checkSequence(t, f.runID+" resumed on the survivor", f.got, tokens); code != "" {
				t.Errorf("%s ended with code %q, want a complete turn", f.runID, code)
			}
		}()
	}
	wg.Wait()
	if moved.Load() != n {
		t.Errorf("%d of the cut gateway's %d sockets closed 1012 run moved once the cut healed, want all", moved.Load(), n)
	}
	for i := range n {
		events := chunksOf(t, ctx, survivor, fmt.Sprintf("cut-%d", i))
		if len(events) != len(demoTurn(tokens))-1 {
			t.Errorf("the log of cut-%d holds %d events, want the %d of a whole turn", i, len(events), len(demoTurn(tokens))-1)
		}
		verifyLog(t, events)
	}
}
