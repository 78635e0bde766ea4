package e2e

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
)

var killTurns = flag.Int("kill-turns", 150, "live turns on each gateway in TestGatewayKilledWithManyTurns (the full size: 1000)")

// TestGatewayKilledWithManyTurns: two gateways on one NATS each hold many live turns (a few
// events a second); kill -9 of one. Resumes through the survivor get every turn of the dead
// gateway ending RUN_ERROR producer_lost, all within the lease TTL plus 5 s of the kill,
// while the survivor's own turns all complete untouched.
func TestGatewayKilledWithManyTurns(t *testing.T) {
	const ttl = 5 * time.Second
	n := *killTurns
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
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
	lost, _ := start(doomed, "lost")
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
	ended := make([]time.Duration, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f := &follower{runID: fmt.Sprintf("lost-%d", i)}
			f.resume(t, ctx, survivor)
			ended[i] = time.Since(killed)
			if code := checkSequence(t, f.runID+" resumed on the survivor", f.got, tokens, "producer_lost"); code != "producer_lost" {
				t.Errorf("%s ended with code %q, want producer_lost", f.runID, code)
			}
		}()
	}
	wg.Wait()
	slices.Sort(ended)
	last := ended[n-1]
	t.Logf("the %d turns of the killed gateway all ended producer_lost within %v of the kill (lease TTL %v; first %v, median %v)",
		n, last.Round(10*time.Millisecond), ttl, ended[0].Round(10*time.Millisecond), ended[n/2].Round(10*time.Millisecond))
	if last > ttl+5*time.Second {
		t.Errorf("the last turn of the killed gateway ended %v after the kill, want within the lease TTL %v plus 5s", last, ttl)
	}
	for i, got := range keptGot {
		if code := checkSequence(t, fmt.Sprintf("kept-%d on the survivor", i), got, tokens); code != "" {
			t.Errorf("kept-%d of the surviving gateway ended %q, want complete", i, code)
		}
	}
}
