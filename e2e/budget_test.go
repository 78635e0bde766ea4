package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wsgateway/wsgateway/internal/tcpproxy"
)

// TestMemoryBudgetThroughStall: turns at full speed while NATS stalls (a proxy between the
// gateway and NATS stops forwarding; its connections stay open, as on a stalled path or
// server). The gateway's memory budget (--memory-budget) bounds what the turns make it hold:
// their agents wait once half of it is used. Once NATS forwards again every turn completes,
// its client receiving every event once and in order, and the gateway's memory stays bounded
// while they catch up as well as during the stall. The full figures (100 turns and 1,000
// sockets through a 20 s stall, the defaults) are bench/stall's; the refusals of new work
// near the budget are conversation's TestMemoryBudgetRefuses.
func TestMemoryBudgetThroughStall(t *testing.T) {
	turns, tokens, stall := 24, 40000, 4*time.Second
	if raceEnabled {
		tokens = 20000
	}
	const budgetBytes = 24 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	host := startGateway(t) // holds the embedded NATS server the other gateway uses
	px := tcpproxy.Start(t, strings.TrimPrefix(host.NATSURL, "nats://"), nil)
	// The lease outlives the stall: the host's reaper would otherwise end the stalled
	// gateway's turns with producer_lost, as it must for a gateway that died.
	gw := startGateway(t, "--nats-url", "nats://"+px.Addr(), "--lease-ttl", "2m", "--max-socket-turns", "1",
		"--memory-budget", strconv.Itoa(budgetBytes))
	pid := gw.cmd.Process.Pid
	base := rssKiB(t, pid, "VmRSS")

	checks, ended := startChecks(t, ctx, gw, "stall", turns, tokens)

	px.Stall()
	stalled := time.Now()
	peak := base
	for time.Since(stalled) < stall {
		peak = max(peak, rssKiB(t, pid, "VmRSS"))
		time.Sleep(50 * time.Millisecond)
	}
	px.Resume()
	// The catch-up: the backlog stored, every client's queue filled, every run's log read
	// back for its thread.
	done := make(chan struct{})
	go func() { ended.Wait(); close(done) }()
	after := base
	for caughtUp := false; !caughtUp; {
		after = max(after, rssKiB(t, pid, "VmRSS"))
		select {
		case <-done:
			caughtUp = true
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Logf("%d turns of %d tokens at full speed, NATS stalled for %v: gateway RSS %d MiB before, peak %d MiB during the stall, %d MiB after it",
		turns, tokens, stall, base>>10, peak>>10, after>>10)

	for _, tc := range checks {
		switch {
		case tc.err != "":
			t.Errorf("%s: %s", tc.runID, tc.err)
		case tc.code != "":
			t.Errorf("%s ended with RUN_ERROR %s across the stall after %d events, want it complete", tc.runID, tc.code, tc.next)
		}
	}
	// The budget holds 12 MiB of events during the stall; the rest is the runtime's
	// headroom, the events in flight and, with -race, the detector's shadow memory. Without
	// the budget the same load grew by some 300 MiB. The catch-up is held by the same
	// bound: the batches in flight and the logs read back for the threads are charged too
	// (one run each on 2 shared cores: 52 MiB of growth over the whole run, 99 before).
	limit := int64(128 << 10)
	if raceEnabled {
		limit = 300 << 10
	}
	if peak-base > limit {
		t.Errorf("gateway RSS grew by %d MiB during the stall, want at most %d MiB", (peak-base)>>10, limit>>10)
	}
	if after-base > limit {
		t.Errorf("gateway RSS grew by %d MiB while the turns caught up after the stall, want at most %d MiB", (after-base)>>10, limit>>10)
	}
}
