package e2e

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/wsgateway/wsgateway/internal/tcpproxy"
)

var outageFull = flag.Bool("outage-full", false, "run TestBacklogDuringOutage at full size (200 turns, a 20s outage, the default bounds; the figure of docs/SECURITY.md) instead of its CI version")

// TestBacklogDuringOutage: turns at full speed while JetStream is unreachable (a proxy
// between the gateway and NATS refuses every connection). The gateway's memory stays bounded
// (--max-run-backlog, --max-backlog): the agents wait instead of buffering. Once NATS is back
// every turn completes, its client receiving every event once and in order.
//
// The CI version runs 24 turns through a 4s outage with small bounds (4 MiB in all, where
// the turns would otherwise buffer some 300 MiB); -outage-full runs 200
// turns through 20s with the defaults, and prints the peak RSS docs/SECURITY.md quotes.
func TestBacklogDuringOutage(t *testing.T) {
	turns, tokens, outage := 24, 40000, 4*time.Second
	if raceEnabled {
		tokens = 20000 // the same bounds engaged, in half the time
	}
	bounds := []string{"--max-run-backlog", "256KiB", "--max-backlog", "4MiB"}
	if *outageFull {
		turns, tokens, outage = 200, 50000, 20*time.Second
		bounds = nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	host := startGateway(t) // holds the embedded NATS server the other gateway uses
	var down atomic.Bool
	px := tcpproxy.Start(t, strings.TrimPrefix(host.NATSURL, "nats://"), func([]byte) bool { return down.Load() })
	// The lease outlives the outage: the host's reaper, which JetStream keeps answering,
	// would otherwise end the cut-off gateway's turns with producer_lost, as it must for a
	// gateway that died.
	gw := startGateway(t, append([]string{"--nats-url", "nats://" + px.Addr(), "--lease-ttl", "2m",
		"--max-socket-turns", "1"}, bounds...)...)
	pid := gw.cmd.Process.Pid
	base := rssKiB(t, pid, "VmRSS")

	checks, ended := startChecks(t, ctx, gw, "outage", turns, tokens)

	down.Store(true)
	px.Cut()
	cut := time.Now()
	peak := base
	for time.Since(cut) < outage {
		peak = max(peak, rssKiB(t, pid, "VmRSS"))
		time.Sleep(50 * time.Millisecond)
	}
	down.Store(false)
	t.Logf("%d turns of %d tokens at full speed, JetStream unreachable for %v: gateway RSS %d MiB before, peak %d MiB during the outage",
		turns, tokens, outage, base>>10, peak>>10)

	ended.Wait()
	hwm := rssKiB(t, pid, "VmHWM")
	completed, codes := 0, map[string]int{}
	for _, tc := range checks {
		if tc.err != "" {
			t.Errorf("%s: %s", tc.runID, tc.err)
			continue
		}
		if tc.code == "" {
			completed++
		} else {
			codes[tc.code]++
		}
	}
	t.Logf("after the outage: %d of %d turns completed, failed by code %v; every client got its events once and in order; peak RSS of the gateway's life %d MiB",
		completed, turns, codes, hwm>>10)
	// At full size, 200 turns at full speed on a small machine can time out their log's
	// creation (a bare RUN_ERROR log_unavailable, the documented answer) before the outage.
	for code, n := range codes {
		if !*outageFull || code != "log_unavailable" {
			t.Errorf("%d turns ended with RUN_ERROR %s across a %v outage, want every turn complete", n, code, outage)
		}
	}
	// The bounds hold the backlog to 4 MiB here (the defaults: 256 MiB); the rest is the
	// runtime, the events in flight and, with -race, the detector's shadow memory.
	// Unbounded (the bounds set to 1000 MiB), the CI version grew by 298 MiB without -race.
	limit := int64(64 << 10)
	if raceEnabled {
		limit = 300 << 10
	}
	if *outageFull {
		limit = 1 << 20
	}
	if peak-base > limit {
		t.Errorf("gateway RSS grew by %d MiB during the outage, want at most %d MiB", (peak-base)>>10, limit>>10)
	}
}

// startChecks starts turns demo turns of tokens deltas at full speed on gw, runIds
// prefix-000…, each followed by a turnCheck, and returns once every one is producing, with
// the wait group that ends when all of them have ended.
func startChecks(t *testing.T, ctx context.Context, gw *gateway, prefix string, turns, tokens int) ([]*turnCheck, *sync.WaitGroup) {
	t.Helper()
	checks := make([]*turnCheck, turns)
	var started sync.WaitGroup
	ended := &sync.WaitGroup{}
	for i := range checks {
		tc := &turnCheck{runID: fmt.Sprintf("%s-%03d", prefix, i), tokens: tokens}
		checks[i] = tc
		c := startTurn(t, ctx, gw, tc.runID, fmt.Sprintf(`{"tokens":%d,"intervalMs":0}`, tokens))
		started.Add(1)
		ended.Add(1)
		go func() {
			defer ended.Done()
			tc.follow(ctx, gw, c, started.Done)
		}()
	}
	started.Wait() // every turn is producing
	return checks, ended
}

// turnCheck follows one demo turn and checks, event by event without keeping them, that its
// client receives the complete turn once and in order, resuming from the last offset when a
// socket ends early.
type turnCheck struct {
	runID  string
	tokens int
	next   int    // index of the next expected event in demoTurn(tokens)
	last   string // offset of the last event
	code   string // the RUN_ERROR code the turn ended with, "" when it completed
	err    string // the first fault seen
}

// want returns the key of event i of the complete turn (demoTurn without building it).
func (tc *turnCheck) want(i int) string {
	switch {
	case i == 0:
		return "CUSTOM"
	case i == 1:
		return "RUN_STARTED"
	case i == 2:
		return "TEXT_MESSAGE_START"
	case i <= tc.tokens+2:
		return "TEXT_MESSAGE_CONTENT t" + strconv.Itoa(i-2) + " "
	case i == tc.tokens+3:
		return "TEXT_MESSAGE_END"
	}
	return "RUN_FINISHED"
}

// feed checks one envelope and reports whether the turn ended.
func (tc *turnCheck) feed(e envelope) bool {
	switch {
	case e.Bare:
		tc.code = e.Code
		return true
	case e.ID == "" || e.ID <= tc.last:
		tc.err = fmt.Sprintf("offset %q after %q: a duplicate or a reordering", e.ID, tc.last)
		return true
	case e.Type == "RUN_ERROR":
		tc.code = e.Code
		return true
	case e.key() != tc.want(tc.next):
		tc.err = fmt.Sprintf("event %d is %q, want %q: a gap, a duplicate or a reordering", tc.next, e.key(), tc.want(tc.next))
		return true
	}
	tc.last = e.ID
	tc.next++
	return e.Type == "RUN_FINISHED"
}

// follow reads c, and resume sockets after it, until the turn ends. producing is called once
// the first content event arrived.
func (tc *turnCheck) follow(ctx context.Context, gw *gateway, c *websocket.Conn, producing func()) {
	var once sync.Once
	defer once.Do(producing)
	for attempt := 0; ; attempt++ {
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				break
			}
			e, ok := parseFrame(data)
			if !ok {
				continue
			}
			if tc.feed(e) {
				c.CloseNow()
				return
			}
			if tc.next > 3 {
				once.Do(producing)
			}
		}
		c.CloseNow()
		if ctx.Err() != nil || attempt == 20 {
			tc.err = fmt.Sprintf("no end after %d events and %d sockets", tc.next, attempt+1)
			return
		}
		var err error
		if c, err = dialWS(ctx, resumeURL(gw, tc.runID, cmp(tc.last, "-1"))); err != nil {
			tc.err = fmt.Sprintf("resume: %v", err)
			return
		}
	}
}

func cmp(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// rssKiB returns a field (VmRSS, VmHWM) of /proc/<pid>/status, in KiB.
func rssKiB(tb testing.TB, pid int, field string) int64 {
	tb.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatalf("reading the gateway's memory: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	tb.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
