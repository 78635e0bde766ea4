package e2e

import (
	"context"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/internal/tcpproxy"
)

// TestShutdownTimeout: a gateway stopped while JetStream is unreachable cannot store its
// turns' terminals; it exits anyway once --drain-timeout and --shutdown-timeout have passed
// (status 1, saying why), and once NATS is reachable a reaper ends the turn's log with one
// terminal and its close.
func TestShutdownTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	host := startGateway(t, "--lease-ttl", "3s", "--takeover", "off") // holds the NATS server; its reaper ends the turn
	var down atomic.Bool
	px := tcpproxy.Start(t, strings.TrimPrefix(host.NATSURL, "nats://"), func([]byte) bool { return down.Load() })
	gw := startGateway(t, "--nats-url", "nats://"+px.Addr(), "--lease-ttl", "3s", "--takeover", "off",
		"--drain-timeout", "1s", "--shutdown-timeout", "2s")
	c := startTurn(t, ctx, gw, "stopped-in-outage", `{"tokens":100000,"intervalMs":20}`)
	f := &follower{runID: "stopped-in-outage"}
	if err := f.read(ctx, c, contentCount(5)); err != nil {
		t.Fatal(err)
	}
	down.Store(true)
	px.Cut()
	stop := time.Now()
	gw.signal(t, syscall.SIGTERM)
	err := gw.wait(t, 30*time.Second)
	took := time.Since(stop)
	if err == nil || took > 8*time.Second {
		t.Errorf("a gateway stopped during an outage exited %v after %v, want status 1 within the drain and shutdown timeouts (3s) and a few seconds", err, took.Round(10*time.Millisecond))
	}
	if recs := gw.logRecords("shutdown timeout: exiting with turns still closing their logs"); len(recs) != 1 {
		t.Errorf("the gateway logged the shutdown timeout %d times, want once", len(recs))
	}
	t.Logf("stopped during an outage: exited (%v) %v after SIGTERM", err, took.Round(10*time.Millisecond))
	down.Store(false)
	f.resume(t, ctx, host)
	code := checkSequence(t, "the turn of a gateway that gave up its shutdown", f.got, 100000, "producer_lost", "shutdown")
	t.Logf("its turn's log ends with RUN_ERROR %s after %d events", code, len(f.got))
}
