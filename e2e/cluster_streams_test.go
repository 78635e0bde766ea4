package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestClusterStreamsSpread: the compose deployment spreads runs over three streams
// (--streams 3) whose leaders the gateways place on three different nodes, so every node
// takes a share of the writes; turns on both gateways land on all three streams and
// complete.
func TestClusterStreamsSpread(t *testing.T) {
	top := startTopology(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	leaders := map[string]string{}
	nodes := map[string]bool{}
	for _, st := range []string{runStream, runStream + "_1", runStream + "_2"} {
		n := top.NATS.leaderOf(t, ctx, st)
		leaders[st] = n.Name
		nodes[n.Name] = true
	}
	t.Logf("stream leaders: %v", leaders)
	if len(nodes) != 3 {
		t.Errorf("the three streams are led by %d nodes (%v), want three", len(nodes), leaders)
	}
	const turns, tokens = 12, 20
	for i := range turns {
		gw := top.A
		if i%2 == 1 {
			gw = top.B
		}
		runID := fmt.Sprintf("spread-%d", i)
		c := startTurn(t, ctx, gw, runID, fmt.Sprintf(`{"tokens":%d,"intervalMs":5}`, tokens))
		got, _, err := readFrames(ctx, c, turnEnded)
		if err != nil {
			t.Fatalf("%s: %v", runID, err)
		}
		checkSequence(t, runID, got, tokens)
		sameLog(t, runID+" vs the log on the other gateway", got, readLog(t, ctx, top.B, runID))
	}
	stored := map[string]uint64{}
	for _, st := range []string{runStream, runStream + "_1", runStream + "_2"} {
		stored[st] = top.NATS.streamMessages(t, ctx, st)
		if stored[st] == 0 {
			t.Errorf("stream %s holds no message after %d turns", st, turns)
		}
	}
	t.Logf("messages per stream after %d turns: %v", turns, stored)
}
